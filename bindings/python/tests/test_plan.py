"""The planner from Python: known numbers, the measured peak, plan_fit."""
import pytest

import llmt
from conftest import SMALL_MODEL


def expected_params(vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, ffn_size,
                    tied, **_):
    d, kv = hidden_size, hidden_size // num_heads * num_kv_heads
    layer = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * ffn_size
    return vocab_size * d * (1 if tied else 2) + num_layers * layer + d


@pytest.mark.parametrize("tied", [False, True])
def test_plan_known_numbers(ctx, tied):
    p = llmt.plan(ctx, model=dict(SMALL_MODEL, tie_embeddings=tied), micro_batch=2, seq_len=32)
    n = expected_params(**SMALL_MODEL, tied=tied)
    assert p.num_params == n
    assert (p.bytes["params"], p.bytes["grads"], p.bytes["optimizer"]) == (4 * n, 4 * n, 8 * n)
    assert p.bytes["activations"] > 0 and p.bytes["staging"] == 0
    assert p.peak == sum(p.bytes.values())  # every category at its peak at once
    bf16 = llmt.plan(ctx, model=dict(SMALL_MODEL, tie_embeddings=tied, precision="bf16_pure"),
                     micro_batch=2, seq_len=32, with_optimizer=False)
    assert (bf16.bytes["params"], bf16.bytes["optimizer"]) == (2 * n, 0)
    assert ctx.memory_stats()["total"]["peak"] == 0  # planning allocated nothing
    assert llmt.Model(ctx, **SMALL_MODEL, tie_embeddings=tied).num_params == n


@pytest.mark.parametrize("recompute, micro", [("none", 4), ("ffn_act+attn_core", 2),
                                               ("full", 1)])
def test_plan_equals_the_measured_peak(shards, recompute, micro):
    with llmt.Context(num_threads=2, seed=3) as ctx:
        p = llmt.plan(ctx, model=SMALL_MODEL, recompute=recompute, micro_batch=micro,
                      seq_len=32)
        model = llmt.Model(ctx, **SMALL_MODEL)
        opt = llmt.Optimizer(model)
        llmt.Recompute(model).set_layers(recompute)
        slicer = llmt.Slicer(model, micro)
        loader = llmt.Loader(ctx, shards["train"], batch_size=4, seq_len=32, vocab_size=260)
        for _ in range(2):
            model.zero_grads()
            slicer.forward_backward(*loader.next())
            opt.step()
        stats = ctx.memory_stats()
        assert {c: stats[c]["peak"] for c in llmt.CATEGORIES} == p.bytes
        assert stats["total"]["peak"] == p.peak
        assert llmt.plan(ctx, model=model, recompute=recompute, micro_batch=micro,
                         seq_len=32) == p


def test_layer_recompute_and_plan_fit(ctx):
    args = dict(model=SMALL_MODEL, micro_batch=8, seq_len=32)
    none, full = llmt.plan(ctx, **args), llmt.plan(ctx, recompute="full", **args)
    mixed = llmt.plan(ctx, layer_recompute=["full", "none"], **args)
    assert full.peak < mixed.peak < none.peak
    assert llmt.plan_fit(ctx, none.peak, **args) == (8, 0)
    assert llmt.plan_fit(ctx, none.peak - 1, **args) == (8, 2)  # ffn_act
    assert llmt.recompute_policy_name(2) == "ffn_act"
    with pytest.raises(llmt.OutOfMemory, match="micro-batch 1 with full recompute needs"):
        llmt.plan_fit(ctx, 1000, **args)


def test_plan_per_rank(ctx):
    # 107328 parameters in 27 granules of 4096; 4 ranks own granules
    # [27 r / 4, 27 (r + 1) / 4): 6, 7, 7, 7 -- rank 1, [24576, 53248), is the
    # largest. fp32: AdamW 8 bytes per owned element, the gradient sum 4, and
    # the exchange buffer 4 from each of the 4 ranks (the 64 MiB window is wider).
    args = dict(model=SMALL_MODEL, micro_batch=2, seq_len=32)
    n = expected_params(**SMALL_MODEL, tied=False)
    assert n == 107328
    single = llmt.plan(ctx, **args)
    assert (single.rank, single.shard) == (-1, (0, n))
    p = llmt.plan(ctx, world_size=4, **args)
    owned = 7 * 4096
    assert (p.rank, p.shard) == (1, (24576, 53248))
    assert p.bytes == dict(single.bytes, optimizer=8 * owned,
                           grads=single.bytes["grads"] + 4 * owned,
                           workspace=single.bytes["workspace"] + 4 * 4 * owned)
    last = llmt.plan(ctx, world_size=4, rank=3, **args)
    assert (last.rank, last.shard, last.bytes["optimizer"]) == (3, (81920, n), 8 * (n - 81920))
    assert llmt.plan_fit(ctx, p.peak, world_size=4, **args) == (2, 0)
    ordered = llmt.plan(ctx, batch_size=4, ordered_accumulation=True, **args)
    assert ordered.bytes["grads"] == 2 * 4 * n
    with pytest.raises(llmt.InvalidArgument, match=r"cfg->rank = 4 \(must be -1"):
        llmt.plan(ctx, world_size=4, rank=4, **args)
    # reduce_mode reaches the library (on the CPU the host keeps every
    # offloaded gradient in both modes: the same plan).
    assert llmt.plan(ctx, world_size=4, reduce_mode="fast", **args) == p
    with pytest.raises(llmt.InvalidArgument, match=r"cfg->reduce_mode = 7 is not an llmt_reduce"):
        llmt.plan(ctx, world_size=4, reduce_mode=7, **args)
    with pytest.raises(ValueError, match="reduce_mode: 'slow' is not one of deterministic, fast"):
        llmt.plan(ctx, world_size=4, reduce_mode="slow", **args)


def test_plan_with_optimizer_offload(ctx):
    """The fields of llmt_plan_config v3 reach the library: the offloaded
    state is in host_state (fp32: two moments, 8 bytes a parameter), not in
    the optimizer's bytes or the device peak."""
    args = dict(model=SMALL_MODEL, micro_batch=2, seq_len=32)
    n = expected_params(**SMALL_MODEL, tied=False)
    on = llmt.plan(ctx, offload_parts=1, offload_layers=-1, **args)
    off = llmt.plan(ctx, **args)
    assert (on.bytes["optimizer"], on.bytes["host_state"]) == (0, 8 * n)
    assert on.peak == off.peak - 8 * n


def test_plan_fit_offload_and_host_peak(ctx):
    """plan_fit_offload climbs to offload before halving the micro-batch:
    one byte under full recompute's device peak buys one offloaded layer at
    the same micro-batch; the offloaded plan's host_peak is its host_state."""
    args = dict(model=SMALL_MODEL, micro_batch=2, seq_len=32)
    full = llmt.plan(ctx, recompute="full", **args)
    assert full.host_peak == 0
    micro, policy, layers = llmt.plan_fit_offload(ctx, full.peak - 1, offload_parts="optimizer",
                                                  **args)
    assert (micro, layers) == (2, 1) and llmt.recompute_policy_name(policy) == "full"
    one = llmt.plan(ctx, recompute="full", offload_parts="optimizer", offload_layers=1, **args)
    assert one.peak <= full.peak - 1 and one.host_peak == one.bytes["host_state"] > 0
    assert llmt.plan_fit(ctx, full.peak - 1, **args)[0] == 1  # without offload: halves
    # A host budget a byte short of that layer's state: no offload, it halves.
    assert llmt.plan_fit_offload(ctx, full.peak - 1, offload_parts="optimizer",
                                 host_budget=one.host_peak - 1, **args)[::2] == (1, 0)
    assert llmt.plan_fit_offload(ctx, full.peak - 1, offload_parts="optimizer",
                                 host_budget=one.host_peak, **args)[::2] == (2, 1)
    with pytest.raises(ValueError, match="offload_parts: 'grads'"):
        llmt.plan(ctx, offload_parts="grads", **args)
    with pytest.raises(llmt.InvalidArgument, match="offload_parts"):
        llmt.plan(ctx, offload_parts=2, **args)


def test_plan_with_grads_offload(ctx):
    """offload_parts="optimizer+grads": the gradients below the split (the
    prefix in whole 4096-element granules) leave the device for the host,
    but for one bucket (the largest layer, embedding or tail starting below
    the split); the fit's rungs offload both, so one layer fits a budget
    that optimizer offload of one layer misses by a byte. An ordered sum
    over several micro-batches is split the same way: the split's 4 bytes a
    parameter on the host, the rest on the device."""
    args = dict(model=SMALL_MODEL, micro_batch=2, seq_len=32, recompute="full")
    n = expected_params(**SMALL_MODEL, tied=False)
    layer = (n - 2 * 260 * 64 - 64) // 2
    split = n // 4096 * 4096
    opt = llmt.plan(ctx, offload_parts="optimizer", **args)
    both = llmt.plan(ctx, offload_parts="optimizer+grads", **args)
    assert both.bytes["grads"] == 4 * (n - split + layer)
    assert both.host_peak == opt.host_peak + 4 * split
    one = llmt.plan(ctx, offload_parts="optimizer", offload_layers=1, **args)
    micro, policy, layers = llmt.plan_fit_offload(ctx, one.peak - 1,
                                                  offload_parts="optimizer+grads", **args)
    assert (micro, layers) == (2, 1) and llmt.recompute_policy_name(policy) == "full"
    summed = llmt.plan(ctx, offload_parts="optimizer+grads", batch_size=4,
                       ordered_accumulation=1, **args)
    assert summed.bytes["grads"] == both.bytes["grads"] + 4 * (n - split)
    assert summed.host_peak == both.host_peak + 4 * split
