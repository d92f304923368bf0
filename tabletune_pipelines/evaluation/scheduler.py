"""The evaluation's vLLM adapters: the controller plugin with the adaptive baselines enabled.

    vllm serve ... --scheduler-cls tabletune_pipelines.evaluation.scheduler.EvaluationScheduler

Exactly ``controller.scheduler`` (the same three hooks, the same sync/async choice), with
``evaluation.baselines.PolicyController`` as the controller, so a published ``policy: turbospec``
or ``policy: nightjar`` chooses k inside the engine. Evaluation only: the production plugin
(``controller.scheduler.ControllerScheduler``) never imports this package.

``AnchoredEvaluationScheduler`` (benchmarks/real_engine_eval.py's adaptive launches, sync scheduling:
the CPU build) runs the same controller under TableTune's timing scheduler
(``engine.timing_scheduler``: one step-log record per step, so kept tokens are counted from the
engine side as in the table launches, and runtime tables), with anchor windows: while the file
named by ``TABLETUNE_EVAL_ANCHOR_FLAG`` exists, the controller is bypassed — no ``next_lookup``, no
``on_step`` — and the timing scheduler's table (``set_k``) is in force, so the same launch measures a
reference table between the adaptive policy's windows (a paired comparison without a new published
version, which would restart the policy). When the flag goes, the controller resumes where it was;
its step clock restarts so no interval spans the anchor window.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from tabletune_pipelines.controller.scheduler import (
    AsyncControllerScheduler,
    ControllerHooks,
    SyncControllerScheduler,
)
from tabletune_pipelines.engine.timing_scheduler import TimingHooks
from tabletune_pipelines.evaluation.baselines import PolicyController

ANCHOR_ENV = "TABLETUNE_EVAL_ANCHOR_FLAG"
"""``AnchoredEvaluationScheduler``: the file whose existence turns an anchor window on."""


class SyncEvaluationScheduler(SyncControllerScheduler):
    """vLLM ``Scheduler`` (sync scheduling) + the controller with the baselines."""

    controller_cls = PolicyController


class AsyncEvaluationScheduler(AsyncControllerScheduler):
    """vLLM ``AsyncScheduler`` (async scheduling) + the controller with the baselines."""

    controller_cls = PolicyController


class EvaluationScheduler:
    """The ``--scheduler-cls`` entry: the async variant when the engine runs async scheduling."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        use_async = bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
        return (AsyncEvaluationScheduler if use_async else SyncEvaluationScheduler)(*args, **kwargs)


class AnchoredEvaluationScheduler(
        TimingHooks, ControllerHooks, Scheduler):
    """Step log + k control around the controller plugin with the baselines (sync scheduling: the
    CPU build), and anchor windows (module docstring)."""

    controller_cls = PolicyController  # the ``policy`` setting picks TableTune, TurboSpec- or Nightjar-style

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ev_flag = os.environ.get(ANCHOR_ENV) or None
        self._ev_anchor = False

    def _ev_check(self) -> bool:
        on = self._ev_flag is not None and os.path.exists(self._ev_flag)
        if on != self._ev_anchor:
            self._ev_anchor = on
            tt = self._tt
            if not on and tt is not None:
                tt._last_t = None
                tt._prev_b = 0
                pol = getattr(tt, "policy", None)
                if pol is not None and hasattr(pol, "_last_t"):
                    pol._last_t = None
        return on

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        try:
            anchor = self._ev_check()
        except Exception:  # noqa: BLE001 - an evaluation hook must not stop the engine either
            anchor = False
        if anchor:
            return Scheduler.schedule(self, *args, **kwargs)
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        if not self._ev_anchor:
            return super().update_from_output(scheduler_output, model_runner_output)
        tt, self._tt = self._tt, None
        try:
            return super().update_from_output(scheduler_output, model_runner_output)
        finally:
            self._tt = tt
