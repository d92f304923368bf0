"""tests/server_lifetimes.py on a small suite run in a fresh pytest process: the modules that use a
shared server run together, in ``SHARED_SERVERS`` order, and each server stops right after its last
user, before the next module's tests run."""

from __future__ import annotations

import json
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = '''
import json, os, pytest
from tests.server_lifetimes import pytest_collection_modifyitems, pytest_runtest_teardown, release_after_last_user

LOG = os.environ["LIFETIME_LOG"]

def note(*words):
    with open(LOG, "a") as f:
        f.write(json.dumps(words) + "\\n")

class Server:
    def __init__(self, name):
        self.name, self.live = name, True
        note("start", name)
    def stop(self):
        if self.live:
            note("stop", self.name)
        self.live = False

def _server(name):
    srv = Server(name)
    release_after_last_user(name, srv)
    yield srv
    srv.stop()

@pytest.fixture(scope="session")
def shared_server():
    yield from _server("shared_server")

@pytest.fixture(scope="session")
def real_model_server():
    yield from _server("real_model_server")

@pytest.fixture
def uses_real(real_model_server):  # a user through another fixture counts too
    return real_model_server

@pytest.fixture(autouse=True)
def _note_test(request):
    note("test", request.node.name)
'''


def test_users_run_together_and_each_server_stops_after_its_last_user(pytester, tmp_path, monkeypatch):
    import tests

    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("LIFETIME_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(Path(tests.__file__).resolve().parents[1]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_a_plain="def test_a1():\n    pass\n",
        test_b_real="def test_b1(uses_real):\n    assert uses_real.live\n\ndef test_b2():\n    pass\n",
        test_c_shared="def test_c1(shared_server):\n    assert shared_server.live\n",
        test_d_plain="def test_d1():\n    pass\n",
        test_e_shared="def test_e1(shared_server):\n    assert shared_server.live\n\ndef test_e2():\n    pass\n",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=7)
    events = [tuple(json.loads(x)) for x in log.read_text().splitlines()]
    assert events == [
        ("start", "shared_server"), ("test", "test_c1"), ("test", "test_e1"),
        ("stop", "shared_server"),  # right after its last user, before the module's next test
        ("test", "test_e2"),
        ("start", "real_model_server"), ("test", "test_b1"), ("stop", "real_model_server"),
        ("test", "test_b2"), ("test", "test_a1"), ("test", "test_d1"),  # modules without a server: last, in order
    ], events
