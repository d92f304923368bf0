"""The vLLM adapter: a ``--scheduler-cls`` that runs the controller inside the engine core.

Turn it on with::

    TABLETUNE_PUBLISHED_TABLE=/data/tables/local.json \\
    vllm serve MODEL --speculative-config '{..., "num_speculative_tokens_per_batch_size": [...]}' \\
        --scheduler-cls tabletune_pipelines.controller.scheduler.ControllerScheduler

``ControllerScheduler`` picks vLLM's ``AsyncScheduler`` base when the engine runs async scheduling
(vLLM's GPU default) and ``Scheduler`` otherwise (e.g. the CPU build, which forces sync);
``SyncControllerScheduler`` and ``AsyncControllerScheduler`` name one base explicitly. The launch
table must list every k the controller may use (docs/controller.md, "Turning it on").

Interfaces used, present in vLLM 0.26 and 0.32 (docs/engine-facts.md, "vLLM interfaces"):
``Scheduler.__init__(vllm_config=...)``, ``Scheduler.schedule``, ``Scheduler.update_from_output``,
``Scheduler.shutdown``, ``Scheduler.dynamic_sd_lookup`` (a list indexed by batch size, read in
``schedule``), ``num_spec_tokens``, ``scheduler_config.max_num_seqs``;
``Scheduler.running`` with ``Request.num_computed_tokens`` (a (batch size x context) table's step context),
``SchedulerOutput.num_scheduled_tokens``, ``.scheduled_spec_decode_tokens``, ``.scheduled_new_reqs``,
``.total_num_scheduled_tokens``, ``.num_spec_tokens_to_schedule``; ``ModelRunnerOutput.req_id_to_index``,
``.sampled_token_ids``; ``VllmConfig.device_config.device_type`` (``cpu`` / ``cuda``; on CUDA the GPU's
model comes from the driver's files, ``identity_match.engine_gpu``). ``AsyncScheduler`` overrides none
of the three hooks in either version.

Nothing here may take the engine down: every hook catches its exceptions and hands them to the
controller, which counts them and logs the first of each kind; a controller that cannot be built
leaves vLLM's scheduler exactly as it is.

Each step's outcome is handed to the controller as one ``step.StepOutcome``, built here once per
step. The controller's Prometheus series (``metrics.metrics_for``: vLLM's ``model_name`` and
``engine`` labels from ``VllmConfig.model_config.served_model_name`` and
``parallel_config.data_parallel_rank``; docs/metrics.md) are built here too. The controller is
``logic.Controller`` (``controller_cls``). Nothing here imports the evaluation package: the
evaluation's TurboSpec-style and Nightjar-style baselines run in an engine only under
``tabletune_pipelines.evaluation.scheduler.EvaluationScheduler`` (the same three hooks, its
``controller_cls`` honouring the ``policy`` setting); under this plugin a published ``policy`` other
than ``tabletune`` is observed only, with a warning.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tabletune_pipelines.controller.loader import DEPLOYMENT_ENV, EngineFacts
from tabletune_pipelines.controller.logic import Controller
from tabletune_pipelines.controller.metrics import metrics_for
from tabletune_pipelines.controller.step import StepOutcome, running_context
from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
from tabletune_pipelines.formats.identity_match import engine_gpu

logger = logging.getLogger("tabletune.controller")
if not logger.handlers and not logging.getLogger("tabletune").handlers and not logging.getLogger().handlers:
    # vLLM configures its own "vllm" logger only; give ours a handler so INFO lines reach the server
    # log. Where the process has configured logging (a root handler), the lines go there instead.
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [tabletune.controller] %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)

# The hooks are a mixin: at run time its base is ``object`` and vLLM's scheduler comes after it in
# the MRO; the type checker sees it as a ``Scheduler``, so ``super()`` and the scheduler's
# attributes (``num_spec_tokens``, ``vllm_config``, ``dynamic_sd_lookup``) are checked against vLLM's.
if TYPE_CHECKING:
    _HooksBase = Scheduler
else:
    _HooksBase = object


def engine_facts(scheduler: Any) -> EngineFacts:
    """What the controller compares the published file with, read from the scheduler's config."""
    cfg = scheduler.vllm_config
    spec = getattr(cfg, "speculative_config", None)
    ranges = getattr(spec, "num_speculative_tokens_per_batch_size", None) if spec is not None else None
    try:
        import vllm

        version = str(getattr(vllm, "__version__", "")) or None
    except Exception:  # noqa: BLE001
        version = None
    model_cfg = getattr(cfg, "model_config", None)
    return EngineFacts(
        max_k=int(scheduler.num_spec_tokens or 0),
        max_num_seqs=int(scheduler.scheduler_config.max_num_seqs),
        launch_ranges=tuple((int(a), int(b), int(k)) for a, b, k in ranges) if ranges else None,
        model=str(getattr(model_cfg, "model", "")) or None,
        method=str(getattr(spec, "method", "")) or None if spec is not None else None,
        # n-gram has no draft model: vLLM leaves speculative_config.model unset (or names the method).
        drafter=(str(getattr(spec, "model", "") or "") or None) if spec is not None and
        getattr(spec, "method", None) != "ngram" else None,
        vllm_version=version,
        gpu=engine_gpu(getattr(getattr(cfg, "device_config", None), "device_type", None)),
        deployment=os.environ.get(DEPLOYMENT_ENV) or None,
        capture_ceiling=engine_capture_ceiling(cfg),
        max_num_batched_tokens=_positive_int(getattr(scheduler.scheduler_config, "max_num_batched_tokens", None)),
    )


def _positive_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def engine_capture_ceiling(cfg: Any) -> int | None:
    """vLLM's capture ceiling in tokens; None when the engine captures no CUDA graphs (eager, the
    CPU build: vLLM sets the ceiling to 0 or leaves it unset, and ``cudagraph_mode`` NONE)."""
    comp = getattr(cfg, "compilation_config", None)
    mode = str(getattr(getattr(comp, "cudagraph_mode", None), "name", "") or "").upper()
    if mode == "NONE":
        return None
    return _positive_int(getattr(comp, "max_cudagraph_capture_size", None))


class ControllerHooks(_HooksBase):
    """The three hooks; mixed in front of vLLM's Scheduler / AsyncScheduler (cooperative super())."""

    _tt: Controller | None = None
    controller_cls: type[Controller] = Controller
    """The controller the hooks drive (the evaluation scheduler puts its policy-honouring one here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tt = None
        self._tt_columns: dict[int, int] = {}
        """id(SchedulerOutput) -> the context bucket it was scheduled with (async scheduling schedules the
        next step before the last one's outcome comes back); only buckets other than the first are kept."""
        try:
            if not self.num_spec_tokens:
                logger.warning("TableTune controller: this launch has no speculative decoding; controller off")
                return
            facts = engine_facts(self)
            metrics = metrics_for(self.vllm_config, facts.max_k, facts.max_num_seqs, logger)
            self._tt = self.controller_cls(facts, os.environ.get(PUBLISHED_ENV) or None, log=logger,
                                           metrics=metrics)
            if self.dynamic_sd_lookup is None:
                pass  # Controller logged that it can only observe
        except Exception as exc:  # noqa: BLE001 - a controller that cannot start must not stop vLLM
            self._tt = None
            logger.warning("TableTune controller: not started (%r); vLLM runs as configured", exc, exc_info=exc)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        tt = self._tt
        if tt is not None:
            try:
                lookup = tt.next_lookup(running_context(self) if tt.grid.lookups is not None else None)
                if lookup is not None and self.dynamic_sd_lookup is not None:
                    self.dynamic_sd_lookup = lookup
            except Exception as exc:  # noqa: BLE001
                tt.fail("choosing the next lookup", exc)
        out = super().schedule(*args, **kwargs)
        if tt is not None and tt.grid.column:
            self._tt_columns[id(out)] = tt.grid.column  # the step's context bucket, read back with its outcome
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        tt = self._tt
        if tt is not None:
            try:
                so, mro = scheduler_output, model_runner_output
                cols = self._tt_columns
                col = cols.pop(id(so), 0) if cols else 0
                if len(cols) > 8:  # outputs never handed back (an aborted step): forget them
                    cols.clear()
                tt.on_step(StepOutcome(so.num_scheduled_tokens, so.scheduled_spec_decode_tokens, mro.req_id_to_index,
                                       mro.sampled_token_ids, getattr(so, "num_spec_tokens_to_schedule", None),
                                       len(so.scheduled_new_reqs), so.total_num_scheduled_tokens, time.monotonic(),
                                       col))
            except Exception as exc:  # noqa: BLE001
                tt.fail("counting a step", exc)
        return out

    def shutdown(self) -> None:
        tt = self._tt
        if tt is not None:
            try:
                tt.close()
            except Exception as exc:  # noqa: BLE001
                tt.fail("the final export", exc)
        base = getattr(super(), "shutdown", None)
        if base is not None:
            base()


class SyncControllerScheduler(ControllerHooks, Scheduler):
    """vLLM ``Scheduler`` (sync scheduling) + the TableTune controller."""


class AsyncControllerScheduler(ControllerHooks, AsyncScheduler):
    """vLLM ``AsyncScheduler`` (async scheduling, vLLM's GPU default) + the TableTune controller."""


def scheduler_class_for(vllm_config: Any) -> type:
    """The variant matching the engine's scheduling mode (decided by vLLM after flag parsing)."""
    use_async = bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
    return AsyncControllerScheduler if use_async else SyncControllerScheduler


class ControllerScheduler:
    """The ``--scheduler-cls`` entry: builds ``AsyncControllerScheduler`` when the engine runs async
    scheduling and ``SyncControllerScheduler`` otherwise."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        return scheduler_class_for(vllm_config)(*args, **kwargs)
