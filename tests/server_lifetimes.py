"""Shared vLLM servers live only as long as their users (hooks imported by tests/conftest.py).

An idle vLLM server is not idle on 2 cores: its processes poll with ``sched_yield()``
(docs/engine-facts.md, "Noise on 2 cores") and take CPU from every test that runs beside it, and a
second CPU server pins its worker to the core the first one polls on. So the run orders the test
modules so each shared server's users run one after another (``pytest_collection_modifyitems``),
and stops a server right after the last test that uses it (``pytest_runtest_teardown``). A fixture
opts in with ``release_after_last_user(name, server)`` and is listed in ``SHARED_SERVERS``."""

from __future__ import annotations

from typing import Any

import pytest

SHARED_SERVERS = ("controller_server", "shared_server", "real_model_server")
"""The fixtures that hold a vLLM server for several test modules, in the order their users run."""

_LIVE_SHARED: dict[str, Any] = {}
_LAST_USER = pytest.StashKey[dict[str, str]]()


def release_after_last_user(fixture: str, server: Any) -> None:
    """Stop ``server`` (a ``VLLMServer``) right after the last test that uses ``fixture``; the fixture's
    own teardown stops it too (``VLLMServer.stop`` of a stopped server does nothing)."""
    _LIVE_SHARED[fixture] = server


def _servers_used(item: pytest.Item) -> list[int]:
    names = getattr(item, "fixturenames", ())
    return [i for i, f in enumerate(SHARED_SERVERS) if f in names]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the modules so each shared server's users run together: modules that use the first
    server of ``SHARED_SERVERS``, then the second, ...; then every other module, in collection order.
    A module keeps its own tests' order and stays in one piece (its module-scoped fixtures start once)."""
    modules: dict[Any, list[pytest.Item]] = {}
    for it in items:
        modules.setdefault(it.getparent(pytest.Module) or it.parent, []).append(it)

    def key(group: list[pytest.Item]) -> tuple[int, int]:
        used = [i for it in group for i in _servers_used(it)]
        none = len(SHARED_SERVERS)
        return (min(used), max(used)) if used else (none, none)

    ordered = sorted(modules.values(), key=key)  # stable: collection order within a key
    items[:] = [it for group in ordered for it in group]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    yield
    stash = item.session.stash
    if _LAST_USER not in stash:  # once a run, on the final (selected, ordered) items
        stash[_LAST_USER] = {SHARED_SERVERS[i]: it.nodeid for it in item.session.items for i in _servers_used(it)}
    for fixture, nodeid in stash[_LAST_USER].items():
        if nodeid == item.nodeid and fixture in _LIVE_SHARED:
            _LIVE_SHARED.pop(fixture).stop()
