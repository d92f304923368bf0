"""VLLMServer before a launch: up-front checks name the bad value; control needs a started server;
process.py keeps one small class per job."""

from __future__ import annotations

import ast
import json
import socket
from pathlib import Path

import pytest

from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.process import VLLMServer, check_config, free_port, port_is_free
from tabletune_pipelines.errors import (
    EngineConfigError,
    EngineError,
    ModelNotFoundError,
    PortInUseError,
    VocabMismatchError,
)


def _model_dir(tmp_path, name: str, vocab: int):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": vocab, "architectures": ["LlamaForCausalLM"]}))
    return d


def test_missing_model_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope"):
        VLLMServer(ServerConfig(model=str(tmp_path / "nope"), work_dir=str(tmp_path / "w"))).start()
    d = _model_dir(tmp_path, "t", 100)
    cfg = ServerConfig(model=str(d), drafter=str(tmp_path / "no-draft"), method="draft_model", num_speculative_tokens=2)
    with pytest.raises(ModelNotFoundError, match="drafter"):
        check_config(cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        check_config(ServerConfig(model=str(tmp_path / "empty")))
    check_config(ServerConfig(model="org/name"))  # a hub name is left to vLLM


def test_vocab_mismatch(tmp_path):
    t = _model_dir(tmp_path, "t", 2048)
    d = _model_dir(tmp_path, "d", 1000)
    cfg = ServerConfig(model=str(t), drafter=str(d), method="draft_model", num_speculative_tokens=2,
                       work_dir=str(tmp_path / "w"))
    with pytest.raises(VocabMismatchError, match="vocab_size 1000 but target .* has 2048"):
        VLLMServer(cfg).start()


def test_port_taken(tmp_path):
    t = _model_dir(tmp_path, "t", 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(PortInUseError, match=f"port = {port}"):
            VLLMServer(ServerConfig(model=str(t), port=port, work_dir=str(tmp_path / "w"))).start()
    assert 0 < free_port() < 65536


def test_control_needs_a_started_server_with_a_table(tmp_path):
    srv = VLLMServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                  table=((1, 8, 3),), work_dir=str(tmp_path)))
    with pytest.raises(EngineError, match="not started"):
        srv.set_k(1)
    with pytest.raises(EngineConfigError, match="k = 4 is outside 0..num_speculative_tokens = 3"):
        srv.set_k(4)
    with pytest.raises(EngineConfigError, match="exactly one of k or table"):
        srv.set_k(1, table=[[1, 8, 1]])
    srv.arm_gate(4)  # no server: nothing to arm, no error
    assert srv.read_steps() == [] and srv.step_log_offset() == 0 and srv.log_tail() == ""
    fixed = VLLMServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                    work_dir=str(tmp_path)))
    with pytest.raises(EngineConfigError, match="needs a launch table"):
        fixed.set_k(1)
    cpu = VLLMServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                  synthetic_acceptance_rates=(0.5, 0.5, 0.5), device="cpu", work_dir=str(tmp_path)))
    assert cpu.can_switch_synthetic_rates
    gpu = VLLMServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                  synthetic_acceptance_rates=(0.5, 0.5, 0.5), device="gpu", work_dir=str(tmp_path)))
    assert gpu.can_switch_synthetic_rates  # through the timing scheduler (engine.gpu_synthetic)
    untimed = VLLMServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                      synthetic_acceptance_rates=(0.5, 0.5, 0.5), device="gpu", step_timing=False,
                                      work_dir=str(tmp_path)))
    assert not untimed.can_switch_synthetic_rates
    with pytest.raises(EngineConfigError, match="step_timing=True"):
        untimed.set_synthetic_rates([0.0, 0.0, 0.0])


MAX_CLASS_LINES = 150
"""Longest class in engine/process.py (lines of its ``class`` statement and body)."""


def test_no_class_in_process_py_grows_back_into_several_jobs():
    """``VLLMServer`` composes its parts (lifecycle here, requests in ``engine/client.py``, control in
    ``engine/runtime_control.py``, the step log in ``engine/step_log.py``); no class here above ~150 lines."""
    path = Path(__file__).resolve().parents[2] / "tabletune_pipelines" / "engine" / "process.py"
    classes = {n.name: n.end_lineno - n.lineno + 1 for n in ast.parse(path.read_text()).body
               if isinstance(n, ast.ClassDef)}
    assert {"ServerProcess", "VLLMServer"} <= set(classes)
    too_long = {name: lines for name, lines in classes.items() if lines > MAX_CLASS_LINES}
    assert not too_long, f"engine/process.py classes over {MAX_CLASS_LINES} lines: {too_long}; move a job out"


STANDIN = """
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from tabletune_pipelines.formats.control_protocol import K_CONTROL_ENV, STEP_LOG_ENV, ControlReader

reader = ControlReader.from_env(K_CONTROL_ENV)


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body):
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        self._send({"version": "0.0.1"} if self.path == "/version" else {})

    def do_POST(self):  # noqa: N802 - one engine step per request: poll the channel, log the step
        self.rfile.read(int(self.headers["Content-Length"]))
        cmd = reader.poll()
        if cmd is not None:
            reader.ack(cmd.seq)
        with open(os.environ[STEP_LOG_ENV], "a") as fh:
            fh.write(json.dumps({"t": time.monotonic(), "b": 1, "k": (cmd.body if cmd else {}).get("k")}) + "\\n")
        self._send({"choices": [{"text": ""}]})


print("stand-in up", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_the_composed_parts_work_together_on_a_stand_in_process(tmp_path, monkeypatch):
    """Start, requests, runtime k, the step log and the stop of the process group, with a stdlib HTTP
    server in place of ``vllm serve`` (no engine): the parts ``VLLMServer`` composes see one launch."""
    import sys

    from tabletune_pipelines.engine import process
    from tabletune_pipelines.engine.process import group_alive

    monkeypatch.setattr(process, "build_command", lambda cfg, port, device: [sys.executable, "-c", STANDIN, str(port)])
    monkeypatch.delenv(process.LAUNCH_LOG_ENV, raising=False)  # not a vLLM launch: the suite's count leaves it out
    cfg = ServerConfig(model="org/name", drafter="org/draft", method="draft_model", num_speculative_tokens=3,
                       table=((1, 8, 3),), device="gpu", startup_timeout=60.0, work_dir=str(tmp_path))
    with VLLMServer(cfg) as srv:
        assert srv.is_alive() and srv.startup_seconds is not None and "stand-in up" in srv.log_tail()
        assert srv.version() == "0.0.1" and srv.complete([[1, 2]], max_tokens=1)["choices"]
        offset = srv.step_log_offset()
        srv.set_k(1, timeout=30.0)  # acknowledged after a nudge, which the stand-in logs as a step
        assert [s["k"] for s in srv.read_steps(offset=offset)][-1] == 1
        srv.check_alive()
    assert not srv.is_alive() and srv.process.proc is None
    assert srv.last_pgid and not group_alive(srv.last_pgid)
