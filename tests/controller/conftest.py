"""ONE real vLLM server with the controller plugin for the controller's engine tests that share its
settings (test_baseline_engine.py, test_engine_method.py, test_feedback_loop.py,
test_engine_metrics.py): tiny target +
1-layer draft model, K = 3, the launch table listing every k (``synthetic.LAUNCH``), max_num_seqs
16, synthetic acceptance switched at runtime (the CPU plugin), the published file named by
``TABLETUNE_PUBLISHED_TABLE``, and ``PROMETHEUS_MULTIPROC_DIR`` set (the controller's series on /metrics).

The scheduler is ``evaluation.scheduler.EvaluationScheduler``: the production plugin's hooks
(``controller.scheduler``) with ``evaluation.baselines.PolicyController``, which is
``controller.logic.Controller`` unless a published version names a baseline ``policy``. So the
method's tests run TableTune's controller and the baseline tests TurboSpec's and Nightjar's in the
same launch. The production entry class ``ControllerScheduler`` runs on the engine in
test_engine_robustness.py (its own launch: a launch table without k = 2, injected faults) and
test_engine_real_acceptance.py (the real model).

Each module takes a ``Rig`` from ``controller_rig``: it sets the module's synthetic rates and
publishes versions of deployment ``DEPLOYMENT`` above whatever the file holds (``Rig``: the
controller installs only newer versions)."""

from __future__ import annotations

from pathlib import Path

import pytest

EVALUATION_SCHEDULER = "tabletune_pipelines.evaluation.scheduler.EvaluationScheduler"
DEPLOYMENT = "local-cpu"
"""The deployment every version on the shared server is published for (a publication refuses to
replace another deployment's file)."""


@pytest.fixture(scope="package")
def controller_server(tmp_path_factory):
    """Started at the first test that asks, stopped after the last test that uses it (tests/conftest.py)."""
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.rig import server_config

    from tabletune_pipelines.controller.metrics import MULTIPROC_ENV
    from tests.conftest import VLLM_CACHE_ENV, release_after_last_user

    wd = tmp_path_factory.mktemp("controller-server")
    # Prometheus's multiprocess folder (empty): the controller's series reach vLLM's /metrics from the
    # engine core process (docs/metrics.md); test_engine_metrics.py scrapes them.
    prom = tmp_path_factory.mktemp("controller-server-prometheus")
    srv = VLLMServer(server_config(wd, wd / "local.json", rates=(0.7, 0.5, 0.3), cls=EVALUATION_SCHEDULER,
                                   extra_env={MULTIPROC_ENV: str(prom), **VLLM_CACHE_ENV}))
    srv.start()
    release_after_last_user("controller_server", srv)
    try:
        yield srv
    finally:
        srv.stop()


def published_path(server) -> Path:
    from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV

    return Path(server.config.extra_env[PUBLISHED_ENV])


@pytest.fixture(scope="module")
def controller_rig(controller_server):
    """``controller_rig(rates)``: a ``Rig`` on the shared server with synthetic acceptance ``rates``
    (its versions go on from the file's)."""
    from tabletune_pipelines.evaluation.rig import Rig

    def make(rates):
        controller_server.set_synthetic_rates(list(rates))
        return Rig(controller_server, published_path(controller_server), deployment=DEPLOYMENT)

    return make
