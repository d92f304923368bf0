"""The engine tests skip where vLLM is not installed. Their shared fixtures (tiny models, the ONE
shared real vLLM server, the default prompt file) live in tests/conftest.py: tests in other
folders use the same server."""

from __future__ import annotations

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
