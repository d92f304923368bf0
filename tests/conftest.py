"""Suite-wide: count the real vLLM launches of the run (``engine.process.LAUNCH_LOG_ENV``; servers
started in subprocesses, e.g. by the ``tabletune`` CLI, count too) and print the count at the end;
the tiny models and the ONE shared tiny draft-model server every folder's engine tests use (a
launch costs 30-40 s of start-up on 2 cores, so tests on the same settings share it and put back
what they change through its runtime controls).

Shared servers (this file's ``shared_server`` and ``real_model_server``, tests/controller/conftest.py's
``controller_server``) live only as long as their users: tests/server_lifetimes.py orders the test
modules so each server's users run one after another and stops a server right after the last test
that uses it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from tabletune_pipelines.engine.process import LAUNCH_LOG_ENV
from tests.server_lifetimes import (  # noqa: F401  (hooks: pytest registers them from this conftest)
    pytest_collection_modifyitems,
    pytest_runtest_teardown,
    release_after_last_user,
)

_LOG = Path(tempfile.mkdtemp(prefix="tt-launches-")) / "launches.jsonl"


def pytest_configure(config):  # noqa: ANN001
    os.environ.setdefault(LAUNCH_LOG_ENV, str(_LOG))


def pytest_terminal_summary(terminalreporter):  # noqa: ANN001
    path = Path(os.environ.get(LAUNCH_LOG_ENV, _LOG))
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    launches = [json.loads(x) for x in lines if x.strip()]
    startup = sum(x.get("startup_s", 0.0) for x in launches)
    terminalreporter.write_line(f"[tabletune] servers started through engine.process in this run: {len(launches)} "
                                f"({startup:.0f} s of start-up)")


VLLM_CACHE_ENV = {"VLLM_CACHE_ROOT": os.environ.get("TABLETUNE_TEST_VLLM_CACHE")
                  or str(Path(tempfile.gettempdir()) / "tabletune-vllm-cache")}
"""``extra_env`` of the suite's own launches: one vLLM cache folder for all of them, kept across runs
like the tiny models (TABLETUNE_TEST_VLLM_CACHE overrides it). vLLM keeps there what it learns about a
model class by importing it in a subprocess (``modelinfos``, keyed by the model file's hash): with a
launch's own folder every launch paid that import again (7 s on 2 idle cores, 31 s at load 8)."""


@pytest.fixture(scope="session")
def tiny_models():
    """The small tiny-model set, cached across sessions (TABLETUNE_TINY_MODELS overrides the folder)."""
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    cache = os.environ.get("TABLETUNE_TINY_MODELS") or str(Path(tempfile.gettempdir()) / "tabletune-tiny-models")
    return ensure_tiny_models(cache, "small")


@pytest.fixture(scope="session")
def shared_config(tiny_models, tmp_path_factory):
    """K = 3 draft-model launch with a table (runtime k switching) and synthetic rates (0.7, 0.5, 0.3)."""
    from tabletune_pipelines.engine.config import ServerConfig

    return ServerConfig(
        model=str(tiny_models.target_dir), drafter=str(tiny_models.draft_dir), method="draft_model",
        num_speculative_tokens=3, table=((1, 8, 3),), synthetic_acceptance_rates=(0.7, 0.5, 0.3),
        max_num_seqs=8, work_dir=str(tmp_path_factory.mktemp("shared-vllm")), extra_env=VLLM_CACHE_ENV,
    )


@pytest.fixture(scope="session")
def shared_server(shared_config):
    """ONE real vLLM server for the whole session; always stopped (process group) at the end."""
    from tabletune_pipelines.engine.process import VLLMServer

    srv = VLLMServer(shared_config)
    srv.start()
    release_after_last_user("shared_server", srv)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory):
    from tabletune_pipelines.engine.acceptance import write_default_prompt_file

    return write_default_prompt_file(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")


@pytest.fixture(scope="session")
def real_model_server(tmp_path_factory):
    """ONE server of the embedded default's real model (SmolLM2-135M-Instruct, ``engine/real_model.py``)
    for the session: ``method: ngram`` (prompt lookup 2..4), K = 3, the launch table
    ``synthetic.LAUNCH``, real verification (no synthetic rates), the production controller plugin
    (``AsyncControllerScheduler``) reading the published file named by ``TABLETUNE_PUBLISHED_TABLE``.
    tests/controller/test_engine_real_acceptance.py runs the controller on it; tests/engine/test_real_model.py
    measures acceptance on it under a published k = 3 everywhere in observe mode. Yields ``server``,
    ``identity`` (the identity the controller reports, for published files) and ``published``; a
    ``Rig`` on them publishes above the version in force."""
    from types import SimpleNamespace

    from tabletune_pipelines.engine import ServerConfig, VLLMServer
    from tabletune_pipelines.engine.real_model import MAX_MODEL_LEN, ensure_real_model
    from tabletune_pipelines.evaluation.rig import SCHEDULER
    from tabletune_pipelines.evaluation.synthetic import IDENTITY, LAUNCH
    from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV

    m = ensure_real_model()  # the venv's one conversion (scripts/setup.sh made it; else made here, once)
    wd = tmp_path_factory.mktemp("real-model-server")
    published = wd / "local.json"
    cfg = ServerConfig(
        model=str(m.model_dir), method="ngram", num_speculative_tokens=3, table=tuple(LAUNCH), max_num_seqs=16,
        max_model_len=MAX_MODEL_LEN, dtype=m.dtype, work_dir=str(wd), step_timing=False,
        extra_args=("--scheduler-cls", SCHEDULER + "AsyncControllerScheduler"),
        speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2}, extra_env={PUBLISHED_ENV: str(published), **VLLM_CACHE_ENV})
    srv = VLLMServer(cfg)
    srv.start()
    release_after_last_user("real_model_server", srv)
    try:
        yield SimpleNamespace(server=srv, published=published,
                              identity=dict(IDENTITY, model=str(m.model_dir), drafter=None, method="ngram",
                                            dtype=m.dtype))
    finally:
        srv.stop()
