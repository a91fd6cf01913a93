/* The training configuration's YAML: every key parsed, every class of error
 * refused with the key, line and column, and written YAML read back equal. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"

static const char *full_yaml =
    "model:\n"
    "  vocab_size: 320\n"
    "  hidden_size: 256\n"
    "  num_layers: 4\n"
    "  num_heads: 8\n"
    "  num_kv_heads: 4\n"
    "  ffn_size: 704\n"
    "  max_seq_len: 512\n"
    "  rms_norm_eps: 1.0e-6\n"
    "  rope_theta: 500000\n"
    "  tie_embeddings: true\n"
    "precision: bf16_mixed\n"
    "optimizer:\n"
    "  lr: 6.0e-4\n"
    "  beta1: 0.85\n"
    "  beta2: 0.98\n"
    "  eps: 1.0e-7\n"
    "  weight_decay: 0.05\n"
    "  decay_norms: true\n"
    "  grad_clip: 0.5\n"
    "schedule:\n"
    "  kind: cosine\n"
    "  warmup_steps: 20\n"
    "  total_steps: 400\n"
    "  min_lr: 6.0e-5\n"
    "loss_scale:\n"
    "  dynamic: false\n"
    "  init_scale: 1024\n"
    "  growth_interval: 50\n"
    "recompute: attn_core+ffn_act\n"
    "batch:\n"
    "  batch_size: 16\n"
    "  micro_batch: 4\n"
    "  seq_len: 256\n"
    "data:\n"
    "  train: \"data/train_*.bin\"\n"
    "  val: data/val_000000.bin\n"
    "  shuffle: false\n"
    "train:\n"
    "  steps: 400\n"
    "  eval_every: 50\n"
    "  eval_batches: 3\n"
    "  log_every: 5\n"
    "  metrics: runs/x/metrics.jsonl\n"
    "  seed: 18446744073709551615\n"
    "  threads: 2\n"
    "checkpoint:\n"
    "  dir: runs/x\n"
    "  every: 100\n"
    "  keep: 3\n"
    "  async: false\n"
    "  fast_dir: /dev/shm/x\n"
    "  fast_every: 10\n"
    "  fast_keep: 1\n"
    "memory:\n"
    "  budget: 1.5GiB\n"
    "  threshold: 0.9\n"
    "  adaptive: false\n";

static void test_defaults(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(c.version, LLMT_TRAIN_CONFIG_VERSION);
    assert_int_equal(c.model.vocab_size, 257); /* the byte tokenizer: 256 bytes + end-of-text */
    assert_true(c.optimizer.lr == 3e-4);
    assert_true(c.loss_scale.init_scale == 65536.0);
    assert_int_equal(c.checkpoint_keep, 5);
    assert_true(c.memory_threshold == 0.85);
    assert_int_equal(llmt_train_config_check(&c), LLMT_OK);
}

static void test_full_file(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(llmt_train_config_parse_yaml(&c, full_yaml, strlen(full_yaml), "full.yaml"),
                     LLMT_OK);
    assert_int_equal(c.model.vocab_size, 320);
    assert_int_equal(c.model.num_kv_heads, 4);
    assert_true(c.model.rms_norm_eps == 1.0e-6f);
    assert_true(c.model.rope_theta == 500000.0f);
    assert_int_equal(c.model.tie_embeddings, 1);
    assert_int_equal(c.model.precision, LLMT_PRECISION_BF16_MIXED);
    assert_true(c.optimizer.lr == 6.0e-4 && c.optimizer.beta1 == 0.85 && c.optimizer.eps == 1.0e-7);
    assert_int_equal(c.optimizer.decay_norms, 1);
    assert_int_equal(c.optimizer.schedule, LLMT_SCHEDULE_COSINE);
    assert_int_equal(c.optimizer.warmup_steps, 20);
    assert_int_equal(c.loss_scale.dynamic, 0);
    assert_int_equal(c.loss_scale.growth_interval, 50);
    assert_true(c.loss_scale.backoff_factor == 0.5); /* not given: default kept */
    assert_int_equal(c.recompute, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT);
    assert_int_equal(c.batch_size, 16);
    assert_int_equal(c.micro_batch, 4);
    assert_string_equal(c.train_data, "data/train_*.bin");
    assert_string_equal(c.val_data, "data/val_000000.bin");
    assert_int_equal(c.shuffle, 0);
    assert_int_equal(c.eval_every, 50);
    assert_string_equal(c.metrics, "runs/x/metrics.jsonl");
    assert_true(c.seed == UINT64_MAX);
    assert_string_equal(c.checkpoint_dir, "runs/x");
    assert_int_equal(c.checkpoint_async, 0);
    assert_string_equal(c.fast_checkpoint_dir, "/dev/shm/x");
    assert_int_equal(c.fast_checkpoint_every, 10);
    assert_true(c.memory_budget == 1610612736ULL); /* 1.5 * 2^30 */
    assert_true(c.memory_threshold == 0.9);
    assert_int_equal(c.adaptive, 0);
    assert_int_equal(llmt_train_config_check(&c), LLMT_OK);
}

/* Parses text over defaults, expecting rc and all needles in the message. */
static void refuse(const char *text, const char *n1, const char *n2)
{
    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(llmt_train_config_parse_yaml(&c, text, strlen(text), "bad.yaml"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), n1);
    assert_contains(llmt_error_last(), n2);
}

static void test_errors_name_key_line_column(void **state)
{
    (void)state;
    refuse("model:\n  hidden_size: 64\n  layers: 2\n", "bad.yaml:3:3: model.layers", "unknown key");
    refuse("optimiser:\n  lr: 1\n", "bad.yaml:1:1: optimiser", "unknown key");
    refuse("model:\n  num_layers: two\n", "bad.yaml:2:15: model.num_layers", "'two' is not an integer");
    refuse("model:\n  num_layers: 0\n", "bad.yaml:2:15: model.num_layers", "0 is outside 1..4096");
    refuse("optimizer:\n  lr: 20\n", "bad.yaml:2:7: optimizer.lr", "outside");
    refuse("optimizer:\n  lr: fast\n", "optimizer.lr", "'fast' is not a number");
    refuse("precision: fp8\n", "bad.yaml:1:12: precision", "not one of fp32, bf16_mixed");
    refuse("data:\n  shuffle: yes\n", "data.shuffle", "'yes' is not true or false");
    refuse("recompute: attn_core+everything\n", "recompute", "joined by '+'");
    refuse("memory:\n  budget: 2 GiBs\n", "memory.budget", "not a byte count");
    refuse("batch:\n  seq_len: 8\n  seq_len: 16\n", "bad.yaml:3:3: batch.seq_len",
           "given twice (first at line 2)");
    refuse("model: 5\n", "bad.yaml:1:8: model", "expected a mapping");
    refuse("batch:\n  seq_len: [1, 2]\n", "batch.seq_len", "found a sequence");
    refuse("- a\n- b\n", "bad.yaml:1:1", "must be a mapping");
    refuse("model:\n  hidden_size: 64\n bad indent: 1\n", "bad.yaml:3", "not valid YAML");
    refuse("train:\n  seed: -1\n", "train.seed", "not a non-negative integer");
    char *long_path = malloc(2100);
    strcpy(long_path, "data:\n  train: ");
    memset(long_path + strlen(long_path), 'a', 1100);
    strcpy(long_path + strlen("data:\n  train: ") + 1100, "\n");
    refuse(long_path, "data.train", "longer than 1023 bytes");
    free(long_path);

    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(llmt_train_config_load_yaml(&c, "/nonexistent/run.yaml"), LLMT_EIO);
    assert_contains(llmt_error_last(), "/nonexistent/run.yaml");
    c.version = 7;
    assert_int_equal(llmt_train_config_parse_yaml(&c, "", 0, NULL), LLMT_EVERSION);
}

/* A '---' mid-file used to end the configuration silently: the keys after
 * it were dropped. */
static void test_one_document_only(void **state)
{
    (void)state;
    refuse("train:\n  steps: 3\n---\ncheckpoint:\n  every: 5\n", "bad.yaml:3:1",
           "a second YAML document");
    refuse("---\ntrain:\n  steps: 3\n---\n", "bad.yaml:4:1", "a second YAML document");
    llmt_train_config c;
    llmt_train_config_init(&c);
    const char *one = "---\ntrain:\n  steps: 3\n...\n";
    assert_int_equal(llmt_train_config_parse_yaml(&c, one, strlen(one), "one.yaml"), LLMT_OK);
    assert_int_equal(c.steps, 3);
}

/* Nesting is bounded before libyaml builds the document: 100000 levels
 * used to take 23 s; now they are refused at once, naming where. */
static void test_nesting_bounded(void **state)
{
    (void)state;
    size_t n = 100000;
    char *deep = malloc(n + 16);
    strcpy(deep, "train: ");
    memset(deep + 7, '[', n);
    deep[7 + n] = '\0';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    refuse(deep, "bad.yaml:1:", "nested deeper than 32 levels");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 1.0);
    free(deep);
    refuse("train:\n  steps: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
           "bad.yaml:2:", "nested deeper than 32 levels");
}

/* A FIFO, a directory or a device as the file is refused without opening it
 * for a blocking read (a FIFO used to block forever). */
static void test_load_refuses_non_regular_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/llmt_test_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/run.yaml", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    llmt_train_config c;
    llmt_train_config_init(&c);
    alarm(10); /* before the fix this blocked: fail by SIGALRM rather than hang */
    assert_int_equal(llmt_train_config_load_yaml(&c, fifo), LLMT_EIO);
    alarm(0);
    assert_contains(llmt_error_last(), fifo);
    assert_contains(llmt_error_last(), "a FIFO, not a regular file");
    assert_int_equal(llmt_train_config_load_yaml(&c, dir), LLMT_EIO);
    assert_contains(llmt_error_last(), "a directory");
    assert_int_equal(llmt_train_config_load_yaml(&c, "/dev/null"), LLMT_EIO);
    assert_contains(llmt_error_last(), "/dev/null: not a regular file");
    unlink(fifo);
    rmdir(dir);
}

/* llmt_train_config_set goes through the loader's checks: the same value
 * gives the same field as in a file, and the same refusals name the key. */
static void test_set_key(void **state)
{
    (void)state;
    llmt_train_config a, b;
    llmt_train_config_init(&a);
    llmt_train_config_init(&b);
    assert_int_equal(llmt_train_config_set(&a, "optimizer.lr", "3e-4"), LLMT_OK);
    assert_true(a.optimizer.lr == 3e-4);
    assert_int_equal(llmt_train_config_set(&a, "batch.batch_size", "4"), LLMT_OK);
    assert_int_equal(a.batch_size, 4);
    assert_int_equal(llmt_train_config_set(&a, "precision", "bf16_pure"), LLMT_OK);
    assert_int_equal(a.model.precision, LLMT_PRECISION_BF16_PURE);
    assert_int_equal(llmt_train_config_set(&a, "recompute", "attn_core+ffn_act"), LLMT_OK);
    assert_int_equal(a.recompute, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT);
    assert_int_equal(llmt_train_config_set(&a, "memory.budget", "1.5GiB"), LLMT_OK);
    assert_true(a.memory_budget == 1610612736ULL);
    assert_int_equal(llmt_train_config_set(&a, "memory.host_budget", "64GiB"), LLMT_OK);
    assert_true(a.memory_host_budget == 64ULL << 30);
    assert_int_equal(llmt_train_config_set(&a, "memory.host_budget", "lots"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "memory.host_budget");
    assert_true(a.memory_host_budget == 64ULL << 30);
    assert_int_equal(llmt_train_config_set(&a, "data.train", "x y/*.bin"), LLMT_OK);
    assert_string_equal(a.train_data, "x y/*.bin");
    assert_int_equal(llmt_train_config_set(&a, "checkpoint.async", "false"), LLMT_OK);
    assert_int_equal(a.checkpoint_async, 0);
    const char *same = "optimizer:\n  lr: 3e-4\nbatch:\n  batch_size: 4\nprecision: bf16_pure\n"
                       "recompute: attn_core+ffn_act\nmemory:\n  budget: 1.5GiB\n"
                       "  host_budget: 64GiB\n"
                       "data:\n  train: x y/*.bin\ncheckpoint:\n  async: false\n";
    assert_int_equal(llmt_train_config_parse_yaml(&b, same, strlen(same), "same"), LLMT_OK);
    assert_memory_equal(&a, &b, sizeof a);

    static const char *const bad[][3] = {
        {"optimizer.lr", "fast", "optimizer.lr: 'fast' is not a number"},
        {"optimizer.lr", "20", "optimizer.lr: 20 is outside [1e-12, 10]"},
        {"model.num_layers", "1e3", "model.num_layers: '1e3' is not an integer"},
        {"train.steps", "-5", "train.steps: -5 is outside 0..1000000000000000"},
        {"train.steps", "99999999999999999999", "train.steps: '99999999999999999999' is not an integer"},
        {"precision", "fp8", "precision: 'fp8' is not one of fp32"},
        {"data.shuffle", "yes", "data.shuffle: 'yes' is not true or false"},
        {"optimizer.lrr", "1", "optimizer.lrr: unknown key"},
        {"optimizer", "1", "optimizer: unknown key"},
        {"lr", "1", "lr: unknown key"},
        {"model.precision", "fp32", "model.precision: unknown key"},
        {".lr", "1", ".lr: unknown key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(llmt_train_config_set(&a, bad[i][0], bad[i][1]), LLMT_EINVAL);
        assert_contains(llmt_error_last(), bad[i][2]);
    }
    assert_memory_equal(&a, &b, sizeof a); /* refusals changed nothing */
    assert_int_equal(llmt_train_config_set(NULL, "train.steps", "1"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg is NULL");
    assert_int_equal(llmt_train_config_set(&a, NULL, "1"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "key is NULL");
    assert_int_equal(llmt_train_config_set(&a, "train.steps", NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "value is NULL");
    a.version = 7;
    assert_int_equal(llmt_train_config_set(&a, "train.steps", "1"), LLMT_EVERSION);
}

static void test_check_relations(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    c.micro_batch = 16;
    assert_int_equal(llmt_train_config_check(&c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "batch.micro_batch = 16 is larger than batch.batch_size = 8");
    llmt_train_config_init(&c);
    c.seq_len = 1024;
    assert_int_equal(llmt_train_config_check(&c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "model.max_seq_len = 256");
    llmt_train_config_init(&c);
    c.model.num_kv_heads = 3;
    assert_int_equal(llmt_train_config_check(&c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "num_kv_heads = 3");
    llmt_train_config_init(&c);
    c.optimizer.schedule = LLMT_SCHEDULE_COSINE;
    assert_int_equal(llmt_train_config_check(&c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "schedule.total_steps");
}

/* optimizer.offload: its three values set llmt_offload_part bits (not an
 * index), "grads" alone is refused naming optimizer+grads, the written
 * YAML names the value, and gradient offload with ordered accumulation
 * passes the relation check. */
static void test_offload_key(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    static const struct {
        const char *text;
        int32_t parts;
    } ok[] = {{"optimizer+grads", LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS},
              {"optimizer", LLMT_OFFLOAD_OPTIMIZER},
              {"none", LLMT_OFFLOAD_NONE}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(llmt_train_config_set(&c, "optimizer.offload", ok[i].text), LLMT_OK);
        assert_int_equal(c.optimizer.offload_parts, ok[i].parts);
    }
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload", "grads"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "optimizer.offload: 'grads' alone");
    assert_contains(llmt_error_last(), "use optimizer+grads");
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload", "grads+optimizer"),
                     LLMT_EINVAL);
    assert_contains(llmt_error_last(), "'grads+optimizer' is not one of none, optimizer, "
                    "optimizer+grads");
    assert_int_equal(c.optimizer.offload_parts, LLMT_OFFLOAD_NONE); /* refusals change nothing */

    const char *yaml = "optimizer:\n  offload: optimizer+grads\n  offload_layers: 0\n";
    assert_int_equal(llmt_train_config_parse_yaml(&c, yaml, strlen(yaml), "grads"), LLMT_OK);
    assert_int_equal(c.optimizer.offload_parts, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS);
    assert_int_equal(c.optimizer.offload_layers, 0);
    char text[8192];
    assert_int_equal(llmt_train_config_to_yaml(&c, text, sizeof text, NULL), LLMT_OK);
    assert_contains(text, "  offload: optimizer+grads\n  offload_layers: 0\n");
    llmt_train_config back;
    llmt_train_config_init(&back);
    assert_int_equal(llmt_train_config_parse_yaml(&back, text, strlen(text), "written"), LLMT_OK);
    assert_memory_equal(&c, &back, sizeof c);

    assert_int_equal(llmt_train_config_set(&c, "batch.accumulation", "ordered"), LLMT_OK);
    assert_int_equal(llmt_train_config_check(&c), LLMT_OK);
}

static void test_write_and_read_back(void **state)
{
    (void)state;
    llmt_train_config a, b;
    llmt_train_config_init(&a);
    assert_int_equal(llmt_train_config_parse_yaml(&a, full_yaml, strlen(full_yaml), "full"), LLMT_OK);
    strcpy(a.val_data, "quote \" backslash \\ tab\t end");
    size_t needed = 0;
    assert_int_equal(llmt_train_config_to_yaml(&a, NULL, 0, &needed), LLMT_OK);
    assert_true(needed > 500);
    char small[16];
    assert_int_equal(llmt_train_config_to_yaml(&a, small, sizeof small, NULL), LLMT_EINVAL);
    char *text = malloc(needed);
    size_t again = 0;
    assert_int_equal(llmt_train_config_to_yaml(&a, text, needed, &again), LLMT_OK);
    assert_int_equal(again, needed);
    assert_int_equal(strlen(text) + 1, needed);
    assert_contains(text, "precision: bf16_mixed\n");
    assert_contains(text, "recompute: attn_core+ffn_act\n");
    assert_contains(text, "  budget: 1610612736\n");
    llmt_train_config_init(&b); /* different defaults would show if a key were missing */
    b.model.vocab_size = 999;
    assert_int_equal(llmt_train_config_parse_yaml(&b, text, strlen(text), "written"), LLMT_OK);
    assert_memory_equal(&a, &b, sizeof a);
    free(text);
}

/* The example configuration of docs/config.md (examples/configs/100m.yaml)
 * loads and passes the relation checks. */
static void test_documented_example(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(llmt_train_config_load_yaml(&c, LLMT_SOURCE_DIR "/examples/configs/100m.yaml"),
                     LLMT_OK);
    assert_int_equal(llmt_train_config_check(&c), LLMT_OK);
    assert_int_equal(c.model.hidden_size, 768);
    assert_int_equal(c.model.precision, LLMT_PRECISION_BF16_MIXED);
    assert_true(c.memory_budget == 20ull << 30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_errors_name_key_line_column),
        cmocka_unit_test(test_one_document_only),
        cmocka_unit_test(test_nesting_bounded),
        cmocka_unit_test(test_load_refuses_non_regular_files),
        cmocka_unit_test(test_set_key),
        cmocka_unit_test(test_check_relations),
        cmocka_unit_test(test_offload_key),
        cmocka_unit_test(test_write_and_read_back),
        cmocka_unit_test(test_documented_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
