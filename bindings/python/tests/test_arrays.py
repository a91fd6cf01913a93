"""numpy in and out: parameters, gradients and optimizer state by name,
token batches, logits, and the memory accounting."""
import numpy as np
import pytest

import llmt
from conftest import SMALL_MODEL


def bf16_round(x):
    """float32 -> bf16 (round to nearest even) -> float32, by bit manipulation."""
    bits = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    sixteen = np.uint64(16)
    lsb = (bits >> sixteen) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + lsb) >> sixteen << sixteen
    return rounded.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def test_bf16_round_reference():
    # 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1).
    halfway = np.float32(1 + 2**-8)
    assert bf16_round(halfway) == 1.0
    assert bf16_round(np.float32(1 + 3 * 2**-8)) == np.float32(1 + 2**-6)  # tie up to even
    assert bf16_round(np.float32(1 + 2**-8 + 2**-20)) == np.float32(1 + 2**-7)


def random_like(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_tensor_listing(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    tensors = model.tensors()
    names = [t[0] for t in tensors]
    assert names[0] == "model.embed_tokens.weight" and "lm_head.weight" in names
    assert dict((n, s) for n, s, _ in tensors)["model.layers.1.mlp.gate_proj.weight"] == (128, 64)
    assert {d for _, _, d in tensors} == {"F32"}
    assert sum(int(np.prod(s)) for _, s, _ in tensors) == model.num_params
    assert model.tensor_index("lm_head.weight") == len(tensors) - 1
    bf16 = llmt.Model(ctx, **SMALL_MODEL, precision="bf16_mixed")
    assert {d for _, _, d in bf16.tensors()} == {"BF16"}


def test_params_and_grads_round_trip_exactly(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    for i, (name, shape, _) in enumerate(model.tensors()):
        values = random_like(shape, i)
        model.set_param(name, values)
        np.testing.assert_array_equal(model.get_param(name), values)
        grads = random_like(shape, 100 + i)
        model.set_grad(name, grads.astype(np.float64))  # converted to float32
        got = model.get_grad(name)
        assert got.dtype == np.float32 and got.shape == shape
        np.testing.assert_array_equal(got, grads)
    model.zero_grads()
    assert not model.get_grad("lm_head.weight").any()


@pytest.mark.parametrize("precision", ["bf16_mixed", "bf16_pure"])
def test_bf16_params_are_rounded_to_nearest_even(ctx, precision):
    model = llmt.Model(ctx, **SMALL_MODEL, precision=precision)
    name = "model.layers.0.mlp.up_proj.weight"
    values = random_like((128, 64), 3)
    values[0, :3] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)]  # ties
    model.set_param(name, values)
    got = model.get_param(name)
    np.testing.assert_array_equal(got, bf16_round(values))
    assert not np.array_equal(got, values)
    model.set_grad(name, values)
    np.testing.assert_array_equal(model.get_grad(name), bf16_round(values))


def test_optimizer_state_round_trips(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    opt = llmt.Optimizer(model)
    assert (opt.state_dtype("exp_avg"), opt.state_dtype("master")) == ("F32", None)
    name = "model.layers.1.self_attn.k_proj.weight"
    for kind in ("exp_avg", "exp_avg_sq"):
        values = np.abs(random_like((32, 64), 5))
        opt.set_state(kind, name, values)
        np.testing.assert_array_equal(opt.get_state(kind, name), values)

    pure = llmt.Optimizer(llmt.Model(ctx, **SMALL_MODEL, precision="bf16_pure"))
    assert pure.state_dtype("exp_avg") == "BF16"
    values = random_like((32, 64), 6)
    pure.set_state("exp_avg", name, values)
    np.testing.assert_array_equal(pure.get_state("exp_avg", name), bf16_round(values))

    mixed = llmt.Optimizer(llmt.Model(ctx, **SMALL_MODEL, precision="bf16_mixed"))
    assert mixed.state_dtype("master") == "F32"
    mixed.set_state("master", name, values)
    np.testing.assert_array_equal(mixed.get_state("master", name), values)


def test_optimizer_settings_at_once(ctx):
    """set_settings takes settings only valid together (a lower lr with a
    lower min_lr, which set() one at a time refuses), leaves the others, and
    changes nothing when one is refused."""
    opt = llmt.Optimizer(llmt.Model(ctx, **SMALL_MODEL), lr=1e-3, min_lr=5e-4)
    with pytest.raises(llmt.InvalidArgument, match="min_lr"):
        opt.set("lr", 1e-4)
    opt.set_settings(lr=1e-4, min_lr=1e-5, schedule="cosine")
    assert (opt.get("lr"), opt.get("min_lr"), opt.config["schedule"]) == (1e-4, 1e-5, "cosine")
    assert opt.get("beta2") == llmt.Optimizer(llmt.Model(ctx, **SMALL_MODEL)).get("beta2")
    with pytest.raises(llmt.InvalidArgument, match="beta1 = 1"):
        opt.set_settings(lr=2e-4, beta1=1.0)
    assert opt.get("lr") == 1e-4
    with pytest.raises(TypeError, match="not a setting: offload_parts"):
        opt.set_settings(offload_parts=1)


def test_logits_agree_with_the_loss(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 260, (2, 16))  # int64 in: converted
    targets = rng.integers(0, 260, (2, 16)).astype(np.int32)
    targets[0, :4] = -1  # ignored
    logits = model.logits(tokens)
    assert logits.shape == (2, 16, 260) and logits.dtype == np.float32
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    mask = targets >= 0
    expected = -logp[mask, targets[mask]].mean()
    assert model.forward(tokens, targets) == pytest.approx(expected, rel=1e-5)
    assert model.forward_backward(tokens, targets) == pytest.approx(expected, rel=1e-5)
    assert model.get_grad("lm_head.weight").any()


@pytest.mark.parametrize("precision, weight, optimizer", [
    ("fp32", 4, 8), ("bf16_mixed", 2, 12), ("fp16_mixed", 2, 12), ("bf16_pure", 2, 4)])
def test_memory_stats_count_bytes_per_parameter(precision, weight, optimizer):
    with llmt.Context(num_threads=2) as ctx:
        stats = ctx.memory_stats()
        assert set(stats) == set(llmt.CATEGORIES) | {"total", "budget", "host_budget",
                                                      "device_total", "device_free"}
        assert stats["total"] == {"current": 0, "peak": 0} and stats["budget"] == 0
        model = llmt.Model(ctx, **SMALL_MODEL, tie_embeddings=True, precision=precision)
        n = model.num_params
        opt = llmt.Optimizer(model)
        stats = ctx.memory_stats()
        assert stats["params"]["current"] == weight * n
        assert stats["grads"]["current"] == weight * n
        assert stats["optimizer"]["current"] == optimizer * n
        assert stats["total"]["current"] == sum(stats[c]["current"] for c in llmt.CATEGORIES)
        assert stats["device_total"] > 0
        ctx.set_budget(1 << 30)
        assert ctx.memory_stats()["budget"] == 1 << 30
        model.close()
        assert opt.closed  # closed first, with its model
        stats = ctx.memory_stats()
        assert stats["total"]["current"] == 0
        assert stats["params"]["peak"] == weight * n


def test_loader_batches_and_state(ctx, shards):
    loader = llmt.Loader(ctx, shards["train"], batch_size=3, seq_len=16, vocab_size=260)
    state = loader.state
    tokens, targets = loader.next()
    assert tokens.shape == targets.shape == (3, 16) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens[:, 1:], targets[:, :-1])
    assert loader.state.windows_consumed == 3
    loader.state = state
    again, _ = loader.next()
    np.testing.assert_array_equal(again, tokens)
    assert loader.num_shards >= 1 and loader.windows_per_epoch * 16 == loader.tokens_per_epoch


def test_byte_tokenizer_and_shards(tmp_path, ctx):
    tokens = llmt.byte_encode("héllo")
    assert tokens.tolist() == list("héllo".encode())
    assert llmt.byte_decode(np.append(tokens, llmt.TOKEN_EOT)) == "héllo".encode()
    assert llmt.byte_decode([]) == b""
    with pytest.raises(llmt.InvalidArgument, match="300"):
        llmt.byte_decode([1, 300])
    llmt.shard_write(tmp_path / "s.bin", np.arange(100) % 257)
    loader = llmt.Loader(ctx, [tmp_path / "s.bin"], batch_size=1, seq_len=9, vocab_size=257,
                         shuffle=False)
    assert loader.next()[0].tolist() == [list(range(9))]
    uniform = ctx.uniform(5)
    assert uniform.dtype == np.float32 and ((uniform >= 0) & (uniform < 1)).all()
