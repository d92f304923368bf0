"""The HTTP client against a stdlib stand-in for vLLM's OpenAI server (what it sends, how it fails)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tabletune_pipelines.engine.client import EngineClient, version_from_answer
from tabletune_pipelines.engine.config import SERVED_MODEL_NAME
from tabletune_pipelines.engine.process import free_port
from tabletune_pipelines.errors import EngineError, EngineUnreachable


@pytest.fixture
def fake_vllm():
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, status, body):
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/version":
                self._send(200, {"version": "0.26.0"})
            elif self.path == "/metrics":
                self._send(200, b"vllm:num_requests_running 0\n")
            else:
                self._send(404, {"error": "no"})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if body["max_tokens"] > 100:
                self._send(400, {"error": "max_tokens too large"})
                return
            n = len(body["prompt"]) if isinstance(body["prompt"][0], list) else 1
            self._send(200, {"choices": [{"text": ""}] * n})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield EngineClient(f"http://127.0.0.1:{srv.server_address[1]}"), seen
    srv.shutdown()
    srv.server_close()


def test_requests(fake_vllm):
    client, seen = fake_vllm
    assert client.healthy() and client.health_status() == 200
    assert client.version() == "0.26.0"
    assert "num_requests_running" in client.metrics_text()
    out = client.complete([[5, 6, 7], [8, 9, 10]], max_tokens=4, ignore_eos=True)
    assert len(out["choices"]) == 2
    assert seen[-1] == {"model": SERVED_MODEL_NAME, "prompt": [[5, 6, 7], [8, 9, 10]], "max_tokens": 4,
                        "temperature": 0.0, "ignore_eos": True}
    client.complete("text", max_tokens=1, seed=3)
    assert seen[-1]["seed"] == 3


def test_bad_status_names_it(fake_vllm):
    client, _ = fake_vllm
    with pytest.raises(EngineError, match="completion request answered 400"):
        client.complete([[1]], max_tokens=1000)


def test_nothing_listening():
    client = EngineClient(f"http://127.0.0.1:{free_port()}")
    assert not client.healthy(timeout=1.0)
    with pytest.raises(EngineUnreachable, match="did not answer"):
        client.version(timeout=1.0)
    assert issubclass(EngineUnreachable, EngineError)


def test_an_error_answer_that_echoes_the_prompt_is_not_quoted(monkeypatch):
    # vLLM's 400 answers can repeat the request; acceptance runs send logged user prompts.
    from tabletune_pipelines.engine.client import EngineClient
    from tabletune_pipelines.errors import EngineError

    secret = "my private prompt text"
    body = json.dumps({"error": {"type": "BadRequestError", "message": f"bad input: {secret}"}}).encode()
    client = EngineClient("http://127.0.0.1:9")
    monkeypatch.setattr(client, "_call", lambda *a, **k: (400, body))
    with pytest.raises(EngineError) as err:
        client.complete(secret, max_tokens=1)
    assert secret not in str(err.value) and "400" in str(err.value) and "BadRequestError" in str(err.value)


@pytest.mark.parametrize("raw", [b'{"version": ""}', b'{"version": "  "}', b"", b"{}", b"[]", b"not json",
                                 b'{"version": 3}', b'{"version": null}'])
def test_a_version_answer_without_a_version_is_refused(raw):
    """The one reading of ``/version`` (remote deployments' probe and the local server alike): an empty
    or missing version is an error, never "" or "unknown"."""
    with pytest.raises(EngineError, match="not vLLM's"):
        version_from_answer(raw, "http://x/version")
    assert version_from_answer(b'{"version": "0.32.0+cpu"}') == "0.32.0+cpu"
    assert version_from_answer(b'{"version": " 0.32.0\\n"}') == "0.32.0"


class _Launched:
    """A stand-in for ``ServerProcess``: a client, a crash check and a log tail."""

    def __init__(self, client, device="gpu", crashed=False):
        self.client, self.device, self.crashed, self.checked = client, device, crashed, 0

    def check_alive(self):
        self.checked += 1
        if self.crashed:
            from tabletune_pipelines.errors import EngineCrashedError
            raise EngineCrashedError("vLLM server is not running", self.log_tail())

    def log_tail(self, lines=40):
        return f"tail {lines}"


def test_server_client_answers_like_the_client_and_marks_the_cpu_build(fake_vllm):
    from tabletune_pipelines.engine.client import ServerClient

    client, _ = fake_vllm
    assert ServerClient(_Launched(client)).version() == "0.26.0"
    assert ServerClient(_Launched(client, device="cpu")).version() == "0.26.0+cpu"
    assert "num_requests_running" in ServerClient(_Launched(client)).metrics_text()
    assert len(ServerClient(_Launched(client)).complete([[1, 2]], max_tokens=1)["choices"]) == 1
    with pytest.raises(EngineError, match="answered 400") as err:
        ServerClient(_Launched(client)).complete([[1]], max_tokens=1000)
    assert "tail 10" in str(err.value)


def test_server_client_checks_for_a_crash_when_nothing_answers():
    from tabletune_pipelines.engine.client import ServerClient
    from tabletune_pipelines.errors import EngineCrashedError

    nobody = EngineClient(f"http://127.0.0.1:{free_port()}")
    alive = _Launched(nobody)
    with pytest.raises(EngineError, match="completion request failed") as err:
        ServerClient(alive).complete("x", max_tokens=1, timeout=1.0)
    assert alive.checked == 1 and "tail 40" in str(err.value)
    with pytest.raises(EngineCrashedError, match="not running"):
        ServerClient(_Launched(nobody, crashed=True)).complete("x", max_tokens=1, timeout=1.0)
