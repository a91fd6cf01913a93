"""The memory planner: the bytes of every category a configuration needs,
computed without allocating (llmt_plan_compute, llmt_plan_fit)."""
import ctypes
from dataclasses import dataclass

from . import _structs as S
from ._convert import enum, fill_struct, init_struct, recompute_policy
from ._lib import lib
from .context import category_dict
from .model import model_config
from .optim import REDUCE_MODES, offload_parts


@dataclass(frozen=True)
class Plan:
    """A plan: ``bytes`` per memory category ({"params": ..., ...}), ``peak``
    (the device's: every category but host_state, at once) and
    ``num_params``; ``rank`` is the rank planned (-1 without world_size),
    ``shard`` the range [first, end) of the flat parameters whose optimizer
    state it holds, and ``host_peak`` the offloaded state's host bytes."""
    bytes: dict
    peak: int
    num_params: int
    rank: int
    shard: tuple
    host_peak: int


def _plan_config(model, layer_recompute, config):
    cfg = init_struct(S.llmt_plan_config, lib.llmt_plan_config_init)
    cfg.model = model_config(model)
    fill_struct(cfg, config, "plan", {"recompute": recompute_policy, "with_optimizer": int,
                                      "ordered_accumulation": int,
                                      "offload_parts": lambda v: offload_parts(
                                          v, "offload_parts"),
                                      "reduce_mode": lambda v: enum(v, REDUCE_MODES,
                                                                    "reduce_mode")})
    keep = None
    if layer_recompute is not None:
        keep = (ctypes.c_int32 * len(layer_recompute))(
            *[recompute_policy(p) for p in layer_recompute])
        cfg.layer_recompute = keep
    return cfg, keep


def plan(context, model=None, layer_recompute=None, **config):
    """Plans a configuration for the backend and threads of ``context``.

    ``model`` is a dict of llmt_model_config fields (over the defaults) or a
    Model; ``layer_recompute`` an optional policy per layer; the other
    keyword arguments are the fields of llmt_plan_config: recompute (every
    layer's policy), micro_batch, seq_len, with_optimizer, and for one rank
    of a data-parallel run with the ZeRO-1 sharded optimizer world_size (0:
    no communicator) and rank (-1: the rank with the largest peak), and for
    a slicer batch_size (the global batch; 0: micro_batch) and
    ordered_accumulation (counted without world_size only), and for the
    optimizer's state in host memory offload_parts ("none", "optimizer" or
    "optimizer+grads": its gradients too) and offload_layers (-1: all; K:
    the embedding and layers 0..K-1), and with world_size the trainer's
    reduce_mode ("deterministic", the default, or "fast": on CUDA it decides
    which offloaded gradients a rank keeps in host memory), and for the fits
    host_budget (bytes the offloaded state may take; 0: none).
    Returns a Plan.
    """
    cfg, _keep = _plan_config(model, layer_recompute, config)
    out = S.new(S.llmt_plan)
    lib.llmt_plan_compute(context._ptr, ctypes.byref(cfg), ctypes.byref(out))
    return Plan(category_dict(out.bytes), out.peak, out.num_params, out.rank,
                (out.shard_first, out.shard_end), out.host_peak)


def plan_fit(context, budget, model=None, layer_recompute=None, **config):
    """The largest micro-batch (from ``micro_batch``, halving) and for it the
    lightest recompute policy whose plan fits ``budget`` bytes (per rank
    with world_size) and, with a ``host_budget``, whose host bytes fit it,
    as (micro_batch, recompute flags); the global batch
    stays batch_size (or the first micro_batch). Raises OutOfMemory with the
    smallest plan's peak when nothing fits. Arguments as plan()."""
    cfg, _keep = _plan_config(model, layer_recompute, config)
    micro, policy = ctypes.c_int32(), ctypes.c_int32()
    lib.llmt_plan_fit(context._ptr, ctypes.byref(cfg), budget, ctypes.byref(micro),
                      ctypes.byref(policy))
    return micro.value, policy.value


def plan_fit_offload(context, budget, model=None, layer_recompute=None, **config):
    """plan_fit with the optimizer's offload on the ladder (offload_parts
    "optimizer", or "optimizer+grads" for the gradients too): at each
    micro-batch recompute first, then full recompute with the state of 1,
    2, ... layers and then all of it in host memory, before the micro-batch
    halves; ``budget`` counts device bytes, and a ``host_budget`` keyword
    (bytes; 0: none) passes over the rungs whose host bytes exceed it. Returns
    (micro_batch, recompute flags, offload layers: 0 none, -1 all)
    (llmt_plan_fit_offload)."""
    cfg, _keep = _plan_config(model, layer_recompute, config)
    micro, policy, layers = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    lib.llmt_plan_fit_offload(context._ptr, ctypes.byref(cfg), budget, ctypes.byref(micro),
                              ctypes.byref(policy), ctypes.byref(layers))
    return micro.value, policy.value, layers.value
