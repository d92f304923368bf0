"""The evaluation's vLLM adapter: the controller plugin with the adaptive baselines enabled.

    vllm serve ... --scheduler-cls tabletune_pipelines.evaluation.scheduler.EvaluationScheduler

Exactly ``controller.scheduler`` (the same three hooks, the same sync/async choice), with
``evaluation.baselines.PolicyController`` as the controller, so a published ``policy: turbospec``
or ``policy: nightjar`` chooses k inside the engine. Evaluation only: the production plugin
(``controller.scheduler.ControllerScheduler``) never imports this package.
"""

from __future__ import annotations

from typing import Any

from tabletune_pipelines.controller.scheduler import AsyncControllerScheduler, SyncControllerScheduler
from tabletune_pipelines.evaluation.baselines import PolicyController


class SyncEvaluationScheduler(SyncControllerScheduler):  # type: ignore[misc]
    """vLLM ``Scheduler`` (sync scheduling) + the controller with the baselines."""

    controller_cls = PolicyController


class AsyncEvaluationScheduler(AsyncControllerScheduler):  # type: ignore[misc]
    """vLLM ``AsyncScheduler`` (async scheduling) + the controller with the baselines."""

    controller_cls = PolicyController


class EvaluationScheduler:
    """The ``--scheduler-cls`` entry: the async variant when the engine runs async scheduling."""

    def __new__(cls, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        use_async = bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
        return (AsyncEvaluationScheduler if use_async else SyncEvaluationScheduler)(*args, **kwargs)
