"""``VLLMServer``: one vLLM server subprocess, from up-front checks to a stopped process group.

``VLLMServer(ServerConfig(...))`` is a context manager: it checks the configuration (model path,
drafter vocabulary, port), starts ``vllm serve`` (``engine/command.py``) in its own process
group on 127.0.0.1, waits for ``/health``, and on exit stops the whole group (SIGTERM, then
SIGKILL). A server that exits or never becomes healthy raises an ``EngineError`` quoting the
log's tail.

Every server runs TableTune's timing scheduler (``engine/timing_scheduler.py``) unless
``step_timing=False``: per-step records go to the launch's step log (``read_steps``),
``set_k(...)`` switches the draft length at runtime and ``arm_gate(n)`` admits the next n
requests in one step, all through the control-file protocol (``control_protocol.py``). On the
CPU build ``set_synthetic_rates(...)`` changes the synthetic acceptance at runtime.

``VLLMServer`` composes one part per job and keeps their methods as its own:

    process    ServerProcess (here): launch, health wait, stop of the process group, log tail
    requests   engine.client.ServerClient: completions, /metrics, /version with the log on failures
    control    engine.runtime_control.RuntimeControl: k, table, admission gate, synthetic rates
    step_log   engine.step_log.StepLog: the timing scheduler's records of this launch
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabletune_pipelines.engine.client import EngineClient, Prompt, ServerClient
from tabletune_pipelines.engine.command import build_command, build_env
from tabletune_pipelines.engine.config import MODEL_DRAFTERS, ServerConfig, looks_like_path
from tabletune_pipelines.engine.installed import resolve_device
from tabletune_pipelines.engine.runtime_control import RuntimeControl
from tabletune_pipelines.engine.step_log import StepLog
from tabletune_pipelines.engine.tiny_models import read_vocab_size
from tabletune_pipelines.errors import (
    EngineCrashedError,
    EngineError,
    EngineStartupError,
    EngineStartupTimeout,
    EngineUnreachable,
    ModelNotFoundError,
    PortInUseError,
    VocabMismatchError,
)
from tabletune_pipelines.vocab import ContextAggregate


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free (it may be taken again before the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_config(config: ServerConfig) -> None:
    """Up-front checks that need the file system / network: paths, vocabularies, port."""
    paths: list[tuple[str, str]] = [("model", config.model)]
    if config.drafter and config.method in MODEL_DRAFTERS:
        paths.append(("drafter", config.drafter))
    for what, name in paths:
        p = Path(name).expanduser()
        if p.exists():
            if not (p / "config.json").exists():
                raise ModelNotFoundError(f"{what} = {name!r} exists but has no config.json; not a model folder")
        elif looks_like_path(name):
            raise ModelNotFoundError(
                f"{what} = {name!r}: no such folder; build it (e.g. ensure_tiny_models) or fix the path")
    if config.method == "draft_model" and config.drafter:
        tv, dv = read_vocab_size(config.model), read_vocab_size(config.drafter)
        if tv is not None and dv is not None and tv != dv:
            raise VocabMismatchError(
                f"drafter {config.drafter!r} has vocab_size {dv} but target {config.model!r} has {tv}; "
                "a draft model must share the target's tokenizer and vocabulary")
    if config.port is not None and not port_is_free(config.port):
        raise PortInUseError(f"port = {config.port} on 127.0.0.1 is already in use; pick another or use port=None")


_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


def install_termination_handler() -> bool:
    """Turn SIGTERM/SIGHUP into ``SystemExit`` so the engines this process started are stopped.

    Servers run in their own process group (so stopping one takes its workers with it), which also
    means a plain ``kill``/``timeout`` of this process would leave them running and holding the
    accelerator's memory (seen on the GPU machine: the next launch found 9.6 of 140 GiB free).
    With this handler, ``with VLLMServer(...)`` blocks unwind and ``_stop_all`` runs. Only the
    main thread can install handlers, and a handler someone else installed is left alone.
    Returns True when installed.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    installed = False
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _exit_on_signal)
            installed = True
    return installed


def _exit_on_signal(signum: int, frame: object) -> None:  # pragma: no cover - exercised in a subprocess
    raise SystemExit(128 + signum)


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter shutdown
    for srv in list(_LIVE):
        try:
            srv.stop()
        except Exception:  # noqa: BLE001
            pass


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count as alive for killpg(0); check /proc for non-zombie members.
    try:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (OSError, IndexError, ValueError):
                continue
        return False
    except OSError:
        return True


LAUNCH_LOG_ENV = "TABLETUNE_LAUNCH_LOG"
"""When set, every server that becomes healthy appends one JSON line (model, K, start-up seconds) to
this file: the test suite counts its vLLM launches with it."""


def _note_launch(config: ServerConfig, startup_s: float) -> None:
    path = os.environ.get(LAUNCH_LOG_ENV)
    if not path:
        return
    # the test that launched it, when pytest runs it (docs/test-times.md counts launches per test)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    line = json.dumps({"model": config.model, "k": config.num_speculative_tokens, "startup_s": round(startup_s, 1),
                       "max_num_seqs": config.max_num_seqs, "dtype": config.dtype, "test": test})
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError:
        pass  # counting launches never fails one


class ServerProcess:
    """The lifecycle of one vLLM server subprocess: launch, health wait, stop, log."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        """The configuration it was built from."""
        self.device = resolve_device(config.device)
        """``cpu`` or ``gpu`` (``auto`` resolved)."""
        if config.work_dir:
            self.work_dir = Path(config.work_dir).expanduser().resolve()
            self.work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="tabletune-vllm-"))
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        """The server's stdout+stderr (first line: the command)."""
        self.step_log_path: Path | None = None
        """The timing scheduler's JSONL records (see ``engine/timing_scheduler.py``)."""
        self.control_path: Path | None = None
        """The k / table / gate channel (``control_protocol.K_CONTROL_ENV``)."""
        self.synthetic_control_path: Path | None = None
        """The synthetic-rates channel (CPU build, ``control_protocol.SYNTHETIC_CONTROL_ENV``)."""
        self.startup_seconds: float | None = None
        """Seconds from launch to a healthy ``/health``."""
        self.last_pgid: int | None = None
        """Process group of the last server started (kept after stop, for checks)."""
        self._log_fh: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def client(self) -> EngineClient:
        """HTTP client of this server."""
        return EngineClient(self.base_url)

    @property
    def command(self) -> list[str]:
        return build_command(self.config, self.port or 0, self.device)

    def start(self) -> ServerProcess:
        if self.proc is not None:
            raise EngineError("server already started")
        check_config(self.config)
        self.port = self.config.port or free_port()
        stem = f"vllm-{self.port}-{int(time.time())}"
        self.log_path = self.work_dir / f"{stem}.log"
        self.step_log_path = self.work_dir / f"{stem}.steps.jsonl"
        self.control_path = self.work_dir / f"{stem}.kctl.json"
        self.synthetic_control_path = self.work_dir / f"{stem}.synthetic.json"
        env = build_env(self.config, self.device, self.work_dir, self.step_log_path, self.control_path,
                        self.synthetic_control_path)
        cmd = build_command(self.config, self.port, self.device)
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_fh.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log_fh.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=str(self.work_dir), start_new_session=True)
        self.last_pgid = self.proc.pid
        _LIVE.add(self)
        install_termination_handler()
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        _note_launch(self.config, self.startup_seconds)
        return self

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.config.startup_timeout
        client = self.client
        while True:
            rc = self.proc.poll() if self.proc else None
            if rc is not None:
                raise EngineStartupError(
                    f"vLLM server exited with code {rc} during start-up (log: {self.log_path})", self.log_tail())
            if client.healthy(timeout=2.0):
                return
            if time.monotonic() > deadline:
                raise EngineStartupTimeout(
                    f"vLLM server not healthy after startup_timeout = {self.config.startup_timeout} s "
                    f"(log: {self.log_path}); raise startup_timeout if the engine is just slow to start",
                    self.log_tail())
            time.sleep(0.5)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` s. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        # start_new_session=True: the server's pid is its process group id.
        pgid = proc.pid
        self.last_pgid = pgid
        rc = stop_group(proc, timeout)
        if self._log_fh:
            self._log_fh.close()
            self._log_fh = None
        _LIVE.discard(self)
        self.proc = None
        return rc

    def kill(self) -> None:
        """SIGKILL the whole group at once (simulates a crash)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise ``EngineCrashedError`` (with the log tail) if the server is gone or unhealthy."""
        if self.proc is None:
            raise EngineCrashedError("vLLM server is not running")
        rc = self.proc.poll()
        if rc is not None:
            raise EngineCrashedError(f"vLLM server exited with code {rc} (log: {self.log_path})", self.log_tail())
        try:
            status = self.client.health_status(timeout=10.0)
        except EngineUnreachable as exc:
            raise EngineCrashedError(f"vLLM server does not answer /health: {exc}", self.log_tail()) from None
        if status != 200:
            raise EngineCrashedError(f"vLLM server /health answered {status}", self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log ("" before the first start)."""
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM process group ``proc.pid``, SIGKILL what is left after ``timeout`` s; ``proc``'s exit code."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        rc: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    # Children (engine core, workers) may outlive the API server; kill what is left.
    deadline = time.monotonic() + (5.0 if rc is not None else 0.0)
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.2)
    if group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc is None:
        rc = proc.wait(timeout=10)
    return rc


class VLLMServer:
    """One vLLM server subprocess. Use as ``with VLLMServer(cfg) as srv: ...``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        """The configuration it was built from."""
        self.process = ServerProcess(config)
        """Launch, health, stop and log of the subprocess."""
        self.device = self.process.device
        """``cpu`` or ``gpu`` (``auto`` resolved)."""
        self.requests = ServerClient(self.process)
        """HTTP requests, with the server log on failures."""
        self.control = RuntimeControl(config, self.device, complete=self.complete, log_tail=self.process.log_tail)
        """Runtime k / table / gate / synthetic rates (channels open once started)."""
        self.step_log = StepLog(None)
        """The timing scheduler's records of the current launch."""

    # ------------------------------------------------------------------ lifecycle (ServerProcess)
    def start(self) -> VLLMServer:
        self.process.start()
        ctl, rates = self.process.control_path, self.process.synthetic_control_path
        if ctl is None or rates is None:  # ServerProcess.start names both before it launches
            raise EngineError("the server process started without its control files")
        self.control.open(ctl, rates)
        self.step_log = StepLog(self.process.step_log_path)
        return self

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` s. Returns the exit code."""
        return self.process.stop(timeout)

    def kill(self) -> None:
        """SIGKILL the whole group at once (simulates a crash)."""
        self.process.kill()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def check_alive(self) -> None:
        """Raise ``EngineCrashedError`` (with the log tail) if the server is gone or unhealthy."""
        self.process.check_alive()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log ("" before the first start)."""
        return self.process.log_tail(lines)

    @property
    def log_path(self) -> Path | None:
        """The server's stdout+stderr (first line: the command)."""
        return self.process.log_path

    @property
    def startup_seconds(self) -> float | None:
        """Seconds from launch to a healthy ``/health``."""
        return self.process.startup_seconds

    @property
    def last_pgid(self) -> int | None:
        """Process group of the last server started (kept after stop, for checks)."""
        return self.process.last_pgid

    # ------------------------------------------------------------------ control (RuntimeControl)
    def set_k(self, k: int | None = None, *, table: Sequence[Sequence[int]] | None = None,
              timeout: float = 30.0, ctx_agg: ContextAggregate | None = None) -> None:
        """Switch the draft length at runtime (``RuntimeControl.set_k``; a 5-item ``table`` with its
        ``ctx_agg`` is a (batch size x context) table)."""
        self.control.set_k(k, table=table, timeout=timeout, ctx_agg=ctx_agg)

    @property
    def can_switch_synthetic_rates(self) -> bool:
        """True when synthetic rates can change at runtime (CPU build + synthetic launch)."""
        return self.control.can_switch_synthetic_rates

    def set_synthetic_rates(self, rates: Sequence[float], timeout: float = 30.0) -> None:
        """Replace the synthetic acceptance rates at runtime (CPU build, synthetic launch only)."""
        self.control.set_synthetic_rates(rates, timeout)

    def arm_gate(self, n: int, timeout: float = 10.0) -> None:
        """Admit the next ``n`` arriving requests in one step (``RuntimeControl.arm_gate``)."""
        self.control.arm_gate(n, timeout)

    # ------------------------------------------------------------------ requests (ServerClient)
    def complete(self, prompt: Prompt, *, max_tokens: int, ignore_eos: bool = False,
                 temperature: float = 0.0, seed: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """One ``/v1/completions`` request (a list of prompts = one batch); returns the decoded JSON answer."""
        return self.requests.complete(prompt, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                      temperature=temperature, seed=seed, timeout=timeout)

    def count_tokens(self, prompt: str) -> int:
        """The prompt's length in tokens as the server's tokenizer counts it (``/tokenize``)."""
        return self.requests.count_tokens(prompt)

    def metrics_text(self) -> str:
        """``/metrics`` (Prometheus text exposition)."""
        return self.requests.metrics_text()

    def version(self) -> str:
        """``/version``; the CPU build's answer carries ``+cpu`` like ``installed_vllm_version``."""
        return self.requests.version()

    # ------------------------------------------------------------------ step log (StepLog)
    def step_log_offset(self) -> int:
        """Current size of the step log: pass as ``offset`` to ``read_steps`` to read only newer records."""
        return self.step_log.offset()

    def read_steps(self, since: float | None = None, until: float | None = None,
                   offset: int = 0) -> list[dict[str, Any]]:
        """Step records (see ``engine/timing_scheduler.py``) with ``since <= t <= until``
        (time.monotonic()), read from byte ``offset`` of the step log on."""
        return self.step_log.read(since, until, offset)
