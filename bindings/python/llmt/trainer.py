"""The trainer (llmt_trainer): steps, the run loop with Python callbacks,
evaluation, checkpoints and resume."""
import contextlib
import ctypes
import math
import signal
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

from . import _structs as S
from ._convert import BACKENDS, fill_struct, init_struct, path_bytes, tier as tier_index
from ._handle import Handle
from ._lib import lib
from .comm import comm_handle
from .config import TrainConfig
from .context import Context, category_dict
from .errors import ConfigWarning, StateError
from .model import Model
from .optim import Optimizer

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class StepReport:
    """One training step (the fields of llmt_step_report). ``memory`` maps
    each category ("params", "grads", "optimizer", "activations",
    "workspace", "staging") to its bytes after the step; ``mem_peak`` is the
    most bytes at once during the step; ``eval_loss`` is None unless the
    step evaluated; ``checkpointed`` has bit 0 set for a durable and bit 1
    for a fast checkpoint."""
    step: int
    loss: float
    grad_norm: float
    lr: float
    loss_scale: float
    skipped: bool
    seconds: float
    tokens_per_second: float
    micro_batch: int
    recompute: int
    recompute_layers: int
    retries: int
    memory: dict
    mem_peak: int
    mem_ratio: float
    capacity: int
    eval_loss: Optional[float]
    checkpointed: int
    tokens_seen: int

    @classmethod
    def _from_c(cls, r):
        return cls(step=r.step, loss=r.loss, grad_norm=r.grad_norm, lr=r.lr,
                   loss_scale=r.loss_scale, skipped=bool(r.skipped), seconds=r.seconds,
                   tokens_per_second=r.tokens_per_second, micro_batch=r.micro_batch,
                   recompute=r.recompute, recompute_layers=r.recompute_layers,
                   retries=r.retries, memory=category_dict(r.mem_current),
                   mem_peak=r.mem_peak, mem_ratio=r.mem_ratio, capacity=r.capacity,
                   eval_loss=None if math.isnan(r.eval_loss) else r.eval_loss,
                   checkpointed=r.checkpointed, tokens_seen=r.tokens_seen)


class _Hooks:
    """The trainer's Python callbacks and the first exception one raised,
    re-raised once the C call returns (exceptions must not cross into C),
    and whether Ctrl-C was pressed meanwhile. Holds no reference to the
    trainer."""

    def __init__(self):
        self.log = None
        self.error = None
        self.interrupted = False

    def catch(self, error):
        if self.error is None:
            self.error = error

    def on_sigint(self, signum, frame):
        self.interrupted = True

    def take_error(self):
        """The exception to raise after a C call (None if none), cleared."""
        error = self.error or (KeyboardInterrupt() if self.interrupted else None)
        self.error, self.interrupted = None, False
        return error

    def log_line(self, user, line):
        try:
            self.log(line.decode("utf-8", errors="replace"))
        except BaseException as e:  # noqa: B036 - re-raised after the C call
            self.catch(e)


@contextlib.contextmanager
def _sigint_deferred(hooks):
    """While a C call that may call back into Python runs, Ctrl-C only sets
    hooks.interrupted: a KeyboardInterrupt raised as a ctypes callback is
    entered would be printed and lost. Only in the main thread, and only
    over Python's default handler."""
    if (threading.current_thread() is not threading.main_thread() or
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    previous = signal.signal(signal.SIGINT, hooks.on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_context(context, c):
    """Warns when the context differs from what the configuration asks of
    the context (which llmt_trainer_create_from_config does not apply)."""
    problems = []
    seed = context.rng_state.seed
    if seed != c.seed:
        problems.append(f"seed is {seed} but train.seed is {c.seed}")
    if c.threads and context.num_threads != c.threads:
        problems.append(f"thread count is {context.num_threads} but train.threads is {c.threads}")
    if context.backend != BACKENDS[c.backend]:
        problems.append(f"backend is {context.backend} but train.backend is "
                        f"{BACKENDS[c.backend]}")
    if problems:
        warnings.warn("Trainer.from_config: the context's " + "; ".join(problems) +
                      ": the context's settings apply (pass context=None to make the context "
                      "from the configuration)", ConfigWarning, stacklevel=3)


class Trainer(Handle):
    """Drives training steps over parts: a Model, an Optimizer and a Loader
    (required), and optionally a LossScaler, Recompute, Slicer (both needed
    when adaptive), an eval Loader and a CheckpointStore.

    Keyword arguments are the fields of llmt_trainer_config over its
    defaults, except that batch_size and seq_len default to the loader's:
    total_steps, eval_every, eval_batches, checkpoint_every,
    fast_checkpoint_every, checkpoint_async, metrics_path, config_yaml,
    adaptive, memory_threshold, hysteresis, relax_window, capacity.
    The trainer is closed before any of its parts.
    """

    def __init__(self, model, optimizer, loader, *, scaler=None, recompute=None, slicer=None,
                 eval_loader=None, store=None, **config):
        parts = S.new(S.llmt_trainer_parts)
        given = dict(model=model, optimizer=optimizer, loader=loader, scaler=scaler,
                     recompute=recompute, slicer=slicer, eval_loader=eval_loader, store=store)
        for name, part in given.items():
            setattr(parts, name, part._ptr if part is not None else None)
        cfg = init_struct(S.llmt_trainer_config, lib.llmt_trainer_config_init)
        cfg.batch_size, cfg.seq_len = loader.batch_size, loader.seq_len
        fill_struct(cfg, config, "Trainer", {
            "metrics_path": lambda v: None if v is None else path_bytes(v),
            "config_yaml": lambda v: None if v is None else v.encode(),
            "checkpoint_async": int, "adaptive": int})
        out = ctypes.POINTER(S.llmt_trainer)()
        lib.llmt_trainer_create(ctypes.byref(out), ctypes.byref(parts), ctypes.byref(cfg))
        self._attach(out, lib.llmt_trainer_free, [p for p in given.values() if p is not None])
        self._setup(model.context, cfg.total_steps, None)
        self._model, self._optimizer = model, optimizer

    @classmethod
    def from_config(cls, context, config, comm=None):
        """A trainer and all its parts from a training configuration: a
        TrainConfig, a path, YAML text or a dict (see TrainConfig).

        The parts are made on ``context``, whose seed, threads and backend
        govern (llmt_trainer_create_from_config does not apply train.seed,
        train.threads, train.backend, train.device; a ConfigWarning says so
        when they differ). With ``context=None`` the context is made from
        those keys, as llmt-train does, and closed with the trainer.

        With ``comm`` (a Comm), one rank of a data-parallel run
        (llmt_trainer_create_from_config_dist; collective, and the ranks'
        configurations must agree): the optimizer is sharded with the
        configuration's dist.reduce, and only rank 0 writes checkpoints and
        metrics. The trainer is closed before the Comm.
        """
        cfg = config if isinstance(config, TrainConfig) else TrainConfig(config)
        c = cfg.struct
        owned = None
        if context is None:
            context = owned = Context(backend=c.backend, device=c.device, num_threads=c.threads,
                                      seed=c.seed)
        else:
            _check_context(context, c)
        out = ctypes.POINTER(S.llmt_trainer)()
        try:
            if comm is None:
                lib.llmt_trainer_create_from_config(ctypes.byref(out), context._ptr,
                                                    ctypes.byref(c))
            else:
                handle = comm_handle(comm, "Trainer.from_config: comm")
                lib.llmt_trainer_create_from_config_dist(ctypes.byref(out), context._ptr,
                                                         ctypes.byref(c), handle)
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        self = cls.__new__(cls)
        self._attach(out, lib.llmt_trainer_free, (context,) if comm is None else (context, comm))
        self._setup(context, c.steps, owned)
        self._model = self._optimizer = None
        return self

    @classmethod
    def from_yaml(cls, context, path, comm=None):
        """Trainer.from_config over the YAML file at ``path``."""
        return cls.from_config(context, TrainConfig().update(path_bytes(path)), comm)

    def _setup(self, context, total_steps, owned_context):
        self._context = context
        self._owned_context = owned_context
        self._borrowed_model = self._borrowed_optimizer = None
        self._hooks = _Hooks()
        self.total_steps = total_steps

    def close(self):
        """Frees the trainer (waiting for an async save in flight) and, for a
        trainer made from a configuration, the parts it owns and a context
        it made. The parts given to Trainer() stay open."""
        super().close()
        if self._owned_context is not None:
            self._owned_context.close()

    @property
    def context(self):
        """The Context the trainer's model lives on."""
        return self._context

    @property
    def model(self):
        """The trainer's Model (for a trainer from a configuration, a Model
        borrowed from it, closed with the trainer)."""
        if self._model is not None:
            return self._model
        return self._borrowed("_borrowed_model", lambda: Model._borrow(
            lib.llmt_trainer_model(self._ptr), self, context=self._context))

    @property
    def optimizer(self):
        """The trainer's Optimizer (for a trainer from a configuration, one
        borrowed from it, closed with the trainer): e.g. to take the
        configured settings after resume_latest() made them the
        checkpoint's (Optimizer.set_settings)."""
        if self._optimizer is not None:
            return self._optimizer
        return self._borrowed("_borrowed_optimizer", lambda: Optimizer._borrow(
            lib.llmt_trainer_optimizer(self._ptr), self, model=self.model))

    def _borrowed(self, slot, make):
        """The part a trainer from a configuration owns, as an object
        borrowing it: the one weakly held in attribute ``slot`` while it is
        alive and open, else a new one from ``make()``, then held there."""
        part = getattr(self, slot) and getattr(self, slot)()
        if part is None or part.closed:
            part = make()
            setattr(self, slot, weakref.ref(part))
        return part

    @property
    def step_index(self):
        """Steps done."""
        return lib.llmt_trainer_step_index(self._ptr)

    def _call(self, fn, *args):
        """Calls fn(trainer, *args) with the trainer marked busy (it cannot be
        closed from a callback) and Ctrl-C deferred, then raises a callback's
        exception, or KeyboardInterrupt for a Ctrl-C meanwhile."""
        native, handle, hooks = self._native, self._ptr, self._hooks
        native.busy += 1
        try:
            with _sigint_deferred(hooks):
                fn(handle, *args)
        finally:
            native.busy -= 1
            error = hooks.take_error()
            if error is not None:
                raise error

    def _not_running(self):
        if self._native is not None and self._native.busy:
            raise StateError("the trainer is running (step() or run() called from a callback)")

    def step(self):
        """One training step; returns its StepReport."""
        self._not_running()
        r = S.new(S.llmt_step_report)
        self._call(lib.llmt_trainer_step, ctypes.byref(r))
        return StepReport._from_c(r)

    def run(self, steps=None, callback=None):
        """Runs ``steps`` more steps (None: until total_steps) in the C loop
        (llmt_trainer_run) and returns the list of their StepReports.

        ``callback(report)`` is called after every step; a true result stops
        the run. An exception it raises stops the run at the end of that
        step and is re-raised here; so does Ctrl-C (KeyboardInterrupt). To
        act on reports while training goes on, use the callback or
        iter_steps().
        """
        self._not_running()
        reports, hooks = [], self._hooks

        def on_step(user, report):
            try:
                r = StepReport._from_c(report.contents)
                reports.append(r)
                stop = callback is not None and callback(r)
                return 1 if stop or hooks.error is not None or hooks.interrupted else 0
            except BaseException as e:  # noqa: B036 - re-raised after the C call
                hooks.catch(e)
                return 1

        thunk = S.llmt_step_callback(on_step)
        lib.llmt_trainer_set_callback(self._ptr, thunk, None)
        try:
            self._call(lib.llmt_trainer_run, _INT64_MAX if steps is None else steps)
        finally:
            lib.llmt_trainer_set_callback(self._ptr, S.llmt_step_callback(), None)  # NULL
        return reports

    def iter_steps(self, steps=None):
        """A generator of StepReports, one llmt_trainer_step per item, for
        ``steps`` more steps (None: until total_steps). Leaving the loop
        stops training; nothing runs between items."""
        done = 0
        while (steps is None or done < steps) and self.step_index < self.total_steps:
            yield self.step()
            done += 1

    def on_log(self, callback):
        """Calls ``callback(line)`` with each line the trainer logs
        (controller decisions, checkpoint fallbacks); None removes it."""
        thunk = S.llmt_log_callback(self._hooks.log_line if callback else 0)  # 0: NULL
        lib.llmt_trainer_set_log(self._ptr, thunk, None)
        self._hooks.log = callback
        self._native.keep["log"] = thunk  # C may call it until the trainer is freed

    def resume_latest(self):
        """Loads the newest valid checkpoint of the store; returns the step
        resumed from, or None for a fresh start (an empty store). Raises
        CorruptData, naming each checkpoint and why it was refused, when the
        store holds checkpoints none of which verifies."""
        step = ctypes.c_int64()
        self._call(lib.llmt_trainer_resume_latest, ctypes.byref(step))
        return None if step.value < 0 else step.value

    def save(self, tier="durable"):
        """Saves a checkpoint of the current state now, synchronously; a step
        this trainer already committed in that tier is not written again."""
        self._call(lib.llmt_trainer_save, tier_index(tier))

    def evaluate(self):
        """The held-out loss over eval_batches batches of the eval loader."""
        loss = ctypes.c_double()
        self._call(lib.llmt_trainer_evaluate, ctypes.byref(loss))
        return loss.value
