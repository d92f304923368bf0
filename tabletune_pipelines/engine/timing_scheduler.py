"""Engine-side step timing and runtime k switching: a vLLM scheduler subclass.

Passed to vLLM with ``--scheduler-cls tabletune_pipelines.engine.timing_scheduler.TimingScheduler``
on the CPU build, ``AutoTimingScheduler`` on a GPU (it builds ``TimingAsyncScheduler`` when the
engine runs async scheduling, vLLM 0.26's default there). It runs inside the engine core process
and imports only vLLM, the stdlib, ``control_protocol`` and ``controller.step`` (stdlib only; the
one count of drafted and kept tokens) (docs/engine-facts.md, "vLLM interfaces"); a table command
also loads ``core.table`` (numpy), the one table expansion.

Per step (each ``update_from_output`` call) it appends one JSON line to the file named by
``TABLETUNE_STEP_LOG`` (if set)::

    {"t": 12345.678,   # time.monotonic() at the end of update_from_output (CLOCK_MONOTONIC,
                       #  comparable with the client's time.monotonic() on the same machine)
     "dt": 4.41,       # ms since the previous update_from_output (the step's wall interval)
     "b": 8,           # requests in the step (len(num_scheduled_tokens))
     "k": 3,           # num_spec_tokens_to_schedule (drafts asked of the drafter this step)
     "d": 24,          # draft tokens verified in this step (sum over requests, finished ones too)
     "a": 0,           # draft tokens kept in this step (sum over requests)
     "new": 0,         # requests newly admitted (first scheduled) in this step
     "tok": 32,        # total scheduled tokens
     "c": 2,           # sequence number of the control command in force
     "x": 310,         # the step's context length, only under a (batch size x context) table: the
                       #  aggregate of the running requests' KV lengths that picked its column
     "dp": [8, 8, 8],  # per draft position: requests that drafted it (only when drafts were counted)
     "ap": [0, 0, 0]}  # per draft position: requests that kept it

"a", "dp" and "ap" count drafts as the controller does (``controller.step.count_drafts``, vLLM's
rule): a request finished or aborted in the step (empty output) counts nothing there, and a draft
longer than K or more kept than drafted is clamped.

Commands arrive on the ``TABLETUNE_K_CONTROL`` channel (``control_protocol.py``), polled once
per step and once per arriving request:

* ``{"k": 2}`` (every batch size uses k) or ``{"table": [[1, 8, 3], [9, 16, 1]]}``: rewrites
  ``dynamic_sd_lookup``, in force from the next step (k is capped at the launch
  ``num_speculative_tokens``; the launch must set a table for switching to be possible).
* ``{"table": [[1, 8, 1, 512, 3], [1, 8, 513, 2048, 1]], "ctx_agg": "mean"}`` (5-item entries, a
  (batch size x context) table; ``ctx_agg`` defaults to ``mean``): before every step the column of
  the running requests' context (``core.table.ContextLookups``, the controller's picker, over
  ``controller.step.running_context``) becomes ``dynamic_sd_lookup``.
* ``{"gate": 8, "gate_timeout": 10.0}``: holds the next 8 arriving requests and hands them to the
  scheduler together (one-shot, expires after ``gate_timeout`` s, checked on arrival), so a timed
  batch of B requests is admitted in one step.

Nothing here may crash the engine: every hook catches its own errors, logs them once, and
carries on without the feature.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from tabletune_pipelines.controller.step import count_drafts, fold, longest, running_context
from tabletune_pipelines.errors import InvalidCommand
from tabletune_pipelines.formats.control_protocol import (
    K_CONTROL_ENV,
    STEP_LOG_ENV,
    Command,
    ControlReader,
    check_k_command,
)

try:  # Imported inside vLLM's engine core; the module stays importable without vLLM for docs/tests.
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
except Exception:  # pragma: no cover - vLLM absent
    Scheduler = object  # type: ignore[assignment,misc]  # a stand-in class where vLLM is not installed
    AsyncScheduler = object  # type: ignore[assignment,misc]  # a stand-in class where vLLM is not installed

# The hooks are a mixin: at run time its base is ``object`` and vLLM's scheduler comes after it in
# the MRO; the type checker sees it as a ``Scheduler``, so ``super()`` and the scheduler's
# attributes (``num_spec_tokens``, ``scheduler_config``) are checked against vLLM's.
if TYPE_CHECKING:
    from tabletune_pipelines.core.table import ContextLookups
    from tabletune_pipelines.vocab import ContextAggregate

    _HooksBase = Scheduler
else:
    _HooksBase = object

logger = logging.getLogger("tabletune.timing_scheduler")

__all__ = ["K_CONTROL_ENV", "STEP_LOG_ENV", "AutoTimingScheduler", "TimingAsyncScheduler", "TimingScheduler",
           "build_lookup", "grid_lookups"]


def build_lookup(table: list[list[int]], max_num_seqs: int, max_k: int) -> list[int]:
    """vLLM's dense lookup (index = batch size, index 0 unused) for ``table``: ``core.table.DraftTable``'s,
    the one expansion (equal to vLLM's ``build_dynamic_sd_schedule_lookup``; tests compare both)."""
    from tabletune_pipelines.core.table import DraftTable  # lazy, like control_protocol's check: core needs numpy

    return DraftTable.from_entries(table).vllm_lookup(max_num_seqs, max_k)


def grid_lookups(table: list[list[int]], max_num_seqs: int, max_k: int,
                 agg: ContextAggregate) -> ContextLookups | None:
    """``core.table.context_lookups`` of a 5-item ``table`` (its column per context bucket, the
    controller's picker); None for a batch-only table, which ``build_lookup`` serves."""
    from tabletune_pipelines.core.table import DraftTable, context_lookups  # lazy: core needs numpy

    grid = DraftTable.from_entries(table, allow_context=True)
    return None if grid.axes.context is None else context_lookups(grid, max_num_seqs, max_k, agg)


class TimingHooks(_HooksBase):
    """Step recording + k control; mixed into vLLM's Scheduler / AsyncScheduler."""

    # Class-level defaults keep every hook safe even if _tt_init failed.
    _tt_errors: set[str] = set()
    _tt_last_t: float | None = None
    _tt_log: Any = None
    _tt_ctl: ControlReader = ControlReader(None)
    _tt_ctl_seq = 0
    _tt_gate: tuple[int, float] | None = None
    _tt_held: list[Any] = []
    _tt_grid: ContextLookups | None = None
    """The columns of the (batch size x context) table in force; None: a batch-only table (or a k)."""
    _tt_ctx: dict[int, int] = {}
    """id(SchedulerOutput) -> the context length its column was picked at (only under a grid)."""

    # Cooperative overrides: the mixin comes first in the MRO, so super() is vLLM's scheduler.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._tt_init()
        except Exception as exc:  # noqa: BLE001
            self._tt_log = None
            self._tt_ctl = ControlReader(None)
            logger.warning("TableTune timing scheduler disabled: %r", exc)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        ctx = None
        if self._tt_grid is not None:
            try:
                ctx = self._tt_pick()
            except Exception as exc:  # noqa: BLE001
                self._tt_fail("context column", exc)
        out = super().schedule(*args, **kwargs)
        if ctx is not None:
            self._tt_ctx[id(out)] = ctx  # read back with the step's outcome (async scheduling runs one ahead)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        self._tt_update(scheduler_output, model_runner_output)
        return out

    def add_request(self, request):
        self._tt_add_request(request, super().add_request)

    def finish_requests(self, request_ids, finished_status):
        try:
            self._tt_drop_held(request_ids)
        except Exception as exc:  # noqa: BLE001
            self._tt_fail("drop held", exc)
        return super().finish_requests(request_ids, finished_status)

    def _tt_init(self) -> None:
        self._tt_errors = set()
        self._tt_last_t = None
        self._tt_log = None
        self._tt_ctl = ControlReader.from_env(K_CONTROL_ENV)
        self._tt_ctl_seq = 0
        self._tt_gate = None
        self._tt_held = []
        self._tt_grid = None
        self._tt_ctx = {}
        path = os.environ.get(STEP_LOG_ENV)
        if path:
            try:
                self._tt_log = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine
            except OSError as exc:
                self._tt_fail("open step log", exc)
        logger.info("TableTune timing scheduler: step log %s, k control %s", path, self._tt_ctl.path)
        self._tt_rates_switch()

    def _tt_rates_switch(self) -> None:
        """On a GPU, the synthetic-rates channel is served here (the CPU build's plugin serves it there)."""
        from tabletune_pipelines.engine.installed import is_cpu_build

        if not is_cpu_build():
            from tabletune_pipelines.engine import gpu_synthetic

            gpu_synthetic.install()

    def _tt_fail(self, what: str, exc: BaseException) -> None:
        if what not in self._tt_errors:
            self._tt_errors.add(what)
            logger.warning("TableTune timing scheduler: %s failed (%r); continuing without it", what, exc)

    def _tt_poll_control(self) -> None:
        """Apply a new command from the control channel, if any, and acknowledge it."""
        cmd = self._tt_ctl.poll()
        if cmd is None:
            return
        try:
            ack = self._tt_apply(cmd)
        except Exception as exc:  # noqa: BLE001 - a bad command is refused, the engine carries on
            self._tt_ctl.reject(cmd.seq, repr(exc))
            self._tt_fail("k control", exc)
            return
        self._tt_ctl_seq = cmd.seq
        error = ack.pop("error", None)
        if error:
            self._tt_ctl.reject(cmd.seq, error, **ack)
        else:
            self._tt_ctl.ack(cmd.seq, **ack)

    def _tt_apply(self, cmd: Command) -> dict[str, Any]:
        """Carry out one command; returns the ack's fields (``error`` when it could not be applied)."""
        body = cmd.body
        max_k = int(self.num_spec_tokens)
        max_seqs = int(self.scheduler_config.max_num_seqs)
        try:
            check_k_command(body, max_k=max_k, max_num_seqs=max_seqs)  # refuse before changing anything
        except InvalidCommand as exc:
            return {"error": str(exc)}
        ack: dict[str, Any] = {}
        table = body.get("table")
        if table is None and body.get("k") is not None:
            table = [[1, max_seqs, int(body["k"])]]
        if table is not None:
            ack["table"] = table
            if self.dynamic_sd_lookup is None:
                ack["error"] = "launch has no num_speculative_tokens_per_batch_size; k cannot be switched"
            elif max_k <= 0:
                ack["error"] = "launch has no speculation"
            else:
                self._tt_grid = grid_lookups(table, max_seqs, max_k, body.get("ctx_agg") or "mean")
                self._tt_ctx = {}
                self.dynamic_sd_lookup = (build_lookup(table, max_seqs, max_k) if self._tt_grid is None
                                          else self._tt_grid.columns[0])
        if body.get("gate"):
            self._tt_gate = (int(body["gate"]), time.monotonic() + float(body.get("gate_timeout", 10.0)))
            ack["gate"] = int(body["gate"])
        return ack

    def _tt_pick(self) -> int:
        """Put the column of the running requests' context in force; returns that context length."""
        grid = self._tt_grid
        assert grid is not None
        ctx, col = grid.step(running_context(self))
        self.dynamic_sd_lookup = grid.columns[col]
        return ctx

    def _tt_record(self, scheduler_output: Any, model_runner_output: Any) -> None:
        now = time.monotonic()
        last, self._tt_last_t = self._tt_last_t, now
        ctxs = self._tt_ctx
        ctx = ctxs.pop(id(scheduler_output), None) if ctxs else None
        if len(ctxs) > 8:  # outputs never handed back (an aborted step): forget them
            ctxs.clear()
        if self._tt_log is None:
            return
        nst = scheduler_output.num_scheduled_tokens
        b = len(nst)
        if b == 0:
            return
        spec = scheduler_output.scheduled_spec_decode_tokens or {}
        verified = 0
        dpos: list[int] = []
        apos: list[int] = []
        kept = 0
        if spec:
            verified = sum(len(toks) for toks in spec.values())
            K = max(0, int(self.num_spec_tokens or 0))
            hd, ha = [0] * (K + 1), [0] * (K + 1)
            _, kept, _ = count_drafts(spec, model_runner_output.req_id_to_index,
                                      model_runner_output.sampled_token_ids, K, hd, ha)
            n = longest(hd)
            if n:
                dpos, apos = fold(hd, ha)
                del dpos[n:], apos[n:]
        rec = {
            "t": round(now, 6),
            "dt": None if last is None else round((now - last) * 1000.0, 4),
            "b": b,
            "k": getattr(scheduler_output, "num_spec_tokens_to_schedule", None),
            "d": verified,
            "a": kept,
            "new": len(scheduler_output.scheduled_new_reqs),
            "tok": scheduler_output.total_num_scheduled_tokens,
            "c": self._tt_ctl_seq,
        }
        if ctx is not None:
            rec["x"] = ctx
        if dpos:
            rec["dp"] = dpos
            rec["ap"] = apos
        self._tt_log.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def _tt_update(self, scheduler_output: Any, model_runner_output: Any) -> None:
        try:
            self._tt_record(scheduler_output, model_runner_output)
        except Exception as exc:  # noqa: BLE001 - never crash the engine
            self._tt_fail("step record", exc)
        try:
            self._tt_poll_control()
        except Exception as exc:  # noqa: BLE001
            self._tt_fail("k control", exc)

    def _tt_admit(self, request: Any) -> list[Any] | None:
        """Admission gate: None = add the request now; a list = add these now (may be empty = hold).

        The profiler arms the gate with ``{"gate": B}`` just before sending B requests, so all B
        reach the waiting queue at once and are scheduled in one step (on 2 cores the API server
        otherwise hands them over across several steps). One-shot; expires after its timeout
        (checked when the next request arrives).
        """
        try:
            self._tt_poll_control()
        except Exception as exc:  # noqa: BLE001
            self._tt_fail("k control", exc)
        gate = self._tt_gate
        if gate is None:
            return None
        self._tt_held.append(request)
        n, deadline = gate
        if len(self._tt_held) >= n or time.monotonic() > deadline:
            held, self._tt_held, self._tt_gate = self._tt_held, [], None
            return held
        return []

    def _tt_add_request(self, request: Any, add: Any) -> None:
        try:
            batch = self._tt_admit(request)
        except Exception as exc:  # noqa: BLE001 - never lose a request
            self._tt_fail("admission gate", exc)
            held, self._tt_held, self._tt_gate = getattr(self, "_tt_held", []), [], None
            batch = [r for r in held if r is not request] + [request]
        if batch is None:
            add(request)
            return
        for r in batch:
            add(r)

    def _tt_drop_held(self, request_ids: Any) -> None:
        if not getattr(self, "_tt_held", None):
            return
        if request_ids is None:
            self._tt_held = []
            self._tt_gate = None
            return
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        self._tt_held = [r for r in self._tt_held if r.request_id not in ids]


class TimingScheduler(TimingHooks, Scheduler):
    """vLLM ``Scheduler`` + TableTune step log + runtime k switching (sync scheduling, e.g. CPU)."""


class TimingAsyncScheduler(TimingHooks, AsyncScheduler):
    """Same as ``TimingScheduler`` on vLLM's ``AsyncScheduler`` (async scheduling, e.g. GPU)."""


class AutoTimingScheduler:
    """``--scheduler-cls`` entry that builds ``TimingAsyncScheduler`` when the engine runs async
    scheduling (vLLM decides that after the flags are parsed, e.g. on GPU) and
    ``TimingScheduler`` otherwise (e.g. the CPU build, which forces sync scheduling)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        use_async = bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
        impl = TimingAsyncScheduler if use_async else TimingScheduler
        return impl(*args, **kwargs)
