"""Launch and stop a vLLM OpenAI-compatible server as a subprocess (DESIGN §4).

``VLLMServer(ServerConfig(...))`` is a context manager: it checks the configuration up front
(model path, drafter vocabulary, port), starts ``vllm serve`` in its own process group on
127.0.0.1, waits for ``/health``, and on exit stops the whole group (SIGTERM, then SIGKILL). A
server that exits or never becomes healthy raises an ``EngineError`` quoting the log's tail.

The CPU build's quirks (DESIGN §4) are applied only when the server runs on the CPU build:
the launcher module that answers ``importlib.metadata.version("vllm")``, the environment
(``VLLM_CPU_KVCACHE_SPACE``, ``TMPDIR``, ``VLLM_CACHE_ROOT``, ``HF_HUB_OFFLINE``,
``VLLM_NO_USAGE_STATS``) and the flags ``--enforce-eager --no-enable-prefix-caching``. On a GPU
vLLM the same code runs plain ``vllm serve``.

Every server runs TableTune's step scheduler (``step_scheduler.TimingScheduler``) unless
``step_timing=False``: per-step records go to ``server.step_log_path`` (JSONL) and
``server.set_k(...)`` switches the draft length at runtime.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabletune_pipelines.core.table import validate_vllm_schedule
from tabletune_pipelines.engine.cpu_plugin import SYNTHETIC_CONTROL_ENV, is_cpu_build
from tabletune_pipelines.engine.errors import (
    EngineConfigError,
    EngineCrashedError,
    EngineError,
    EngineStartupError,
    EngineStartupTimeout,
    ModelNotFoundError,
    PortInUseError,
    VocabMismatchError,
)
from tabletune_pipelines.engine.step_scheduler import K_CONTROL_ENV, STEP_LOG_ENV
from tabletune_pipelines.engine.tiny_models import read_vocab_size
from tabletune_pipelines.errors import TableTuneError

SERVED_MODEL_NAME = "tabletune-target"
METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix", "dflash")
#: Methods whose drafter is a separate model given by path or hub name.
MODEL_DRAFTERS = ("draft_model", "eagle", "eagle3", "dflash")
DEVICES = ("auto", "cpu", "gpu")
#: ``--speculative-config`` keys written from ServerConfig's typed fields; ``speculative_extra`` may
#: not override them (a deployment's own table or rejection mode must not leak into a measurement).
OWNED_SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                          "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")


def _looks_like_path(name: str) -> bool:
    """Absolute, home- or dot-relative names are paths; ``org/name`` is left to vLLM as a hub name."""
    return name.startswith(("/", ".", "~"))


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one vLLM server. Validated on construction."""

    model: str
    """Target model: a local folder (must exist) or a hub name (must be in the local HF cache)."""
    drafter: str | None = None
    """Draft model folder / hub name for ``draft_model``/``eagle``/``eagle3``; None for ``ngram``."""
    method: str | None = None
    """Speculative method (``draft_model``, ``ngram``, ``eagle``, ``eagle3``, ...); None = no speculation."""
    num_speculative_tokens: int | None = None
    """Launch K (``num_speculative_tokens``): the largest k; required with a method."""
    table: tuple[tuple[int, int, int], ...] | None = None
    """``num_speculative_tokens_per_batch_size`` ranges ``[[start, end, k], ...]``; None = fixed K.
    Needed for runtime k switching."""
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    """Per-position unconditional acceptance for ``rejection_sample_method: "synthetic"``
    (length K, non-increasing, in [0, 1]; all zeros rejects every draft); None = real verification."""
    max_num_seqs: int = 16
    """Largest batch size the engine schedules."""
    max_model_len: int = 512
    """Context length (prompt + output tokens)."""
    dtype: str = "bfloat16"
    """Model dtype passed as ``--dtype``."""
    enforce_eager: bool = False
    """``--enforce-eager`` (no CUDA graphs / torch.compile). Off by default so GPU timing runs the
    CUDA-graph mode production uses; always on for the CPU build (DESIGN §4)."""
    device: str = "auto"
    """``auto`` (CPU build → cpu, else gpu), ``cpu`` or ``gpu``: selects the CPU workarounds."""
    startup_timeout: float = 240.0
    """Seconds to wait for a healthy ``/health`` before killing the server."""
    port: int | None = None
    """Port on 127.0.0.1; None picks a free one."""
    work_dir: str | None = None
    """Folder for logs, step records, TMPDIR and VLLM_CACHE_ROOT; None = a fresh temp folder."""
    speculative_extra: Mapping[str, Any] = field(default_factory=dict)
    """More ``--speculative-config`` keys (e.g. ``prompt_lookup_max``, ``draft_load_config``)."""
    extra_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags, appended last."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """More environment variables for the server (override the defaults)."""
    kv_cache_space_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE`` on the CPU build (GiB; vLLM's default asks 0.9 x RAM)."""
    step_timing: bool = True
    """Run TableTune's step scheduler (step records + runtime k switching)."""
    enable_prefix_caching: bool = False
    """Prefix caching; off so repeated timing prompts are not served from cache."""
    seed: int = 0
    """``--seed`` of the engine."""
    python: str = sys.executable
    """Python interpreter that runs the launcher (the one with vLLM installed)."""

    def __post_init__(self) -> None:
        owned = sorted(set(self.speculative_extra) & set(OWNED_SPECULATIVE_KEYS))
        if owned:
            raise EngineConfigError(
                f"speculative_extra sets {owned}, which ServerConfig's own fields control (method, drafter, "
                "num_speculative_tokens, table, synthetic_acceptance_rates); set those fields instead")
        if not isinstance(self.model, str) or not self.model.strip():
            raise EngineConfigError(f"model = {self.model!r} must be a non-empty path or model name")
        if self.method is not None and self.method not in METHODS:
            raise EngineConfigError(f"method = {self.method!r} is not a speculative method; choose one of {METHODS} or None")
        if self.method is None:
            for name in ("drafter", "num_speculative_tokens", "table", "synthetic_acceptance_rates"):
                if getattr(self, name) is not None:
                    raise EngineConfigError(f"{name} = {getattr(self, name)!r} needs a speculative method (method is None)")
        else:
            k = self.num_speculative_tokens
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise EngineConfigError(f"num_speculative_tokens = {k!r} must be an integer >= 1 with method {self.method!r}")
            if self.method in MODEL_DRAFTERS and not self.drafter:
                raise EngineConfigError(f"drafter = {self.drafter!r}: method {self.method!r} needs a draft model")
            if self.method == "ngram" and self.drafter:
                raise EngineConfigError(f"drafter = {self.drafter!r}: n-gram drafting takes no draft model")
        if self.table is not None:
            try:
                parsed = validate_vllm_schedule([list(r) for r in self.table])
            except TableTuneError as exc:
                raise EngineConfigError(f"table = {self.table!r}: {exc}") from None
            object.__setattr__(self, "table", tuple(tuple(r) for r in parsed))
        if self.synthetic_acceptance_rates is not None:
            rates = tuple(float(r) for r in self.synthetic_acceptance_rates)
            if len(rates) != self.num_speculative_tokens:
                raise EngineConfigError(
                    f"synthetic_acceptance_rates = {rates!r} has {len(rates)} entries; it needs "
                    f"num_speculative_tokens = {self.num_speculative_tokens}")
            for i, r in enumerate(rates, 1):
                if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                    raise EngineConfigError(f"synthetic_acceptance_rates: a_{i} = {r!r} is outside [0, 1]")
                if i > 1 and r > rates[i - 2]:
                    raise EngineConfigError(
                        f"synthetic_acceptance_rates: a_{i} = {r!r} > a_{i - 1} = {rates[i - 2]!r}; must be non-increasing")
            object.__setattr__(self, "synthetic_acceptance_rates", rates)
        for name in ("max_num_seqs", "max_model_len", "kv_cache_space_gib"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineConfigError(f"{name} = {v!r} must be an integer >= 1")
        if self.device not in DEVICES:
            raise EngineConfigError(f"device = {self.device!r} must be one of {DEVICES}")
        if not (isinstance(self.startup_timeout, int | float) and self.startup_timeout > 0):
            raise EngineConfigError(f"startup_timeout = {self.startup_timeout!r} must be a positive number of seconds")
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise EngineConfigError(f"port = {self.port!r} must be in 1..65535 or None")
        if not self.dtype:
            raise EngineConfigError(f"dtype = {self.dtype!r} must be set (e.g. 'bfloat16')")
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``--speculative-config`` JSON object, or None without speculation."""
        if self.method is None:
            return None
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.drafter:
            cfg["model"] = self.drafter
        if self.table is not None:
            cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.table]
        if self.synthetic_acceptance_rates is not None:
            cfg["rejection_sample_method"] = "synthetic"
            cfg["synthetic_acceptance_rates"] = list(self.synthetic_acceptance_rates)
        cfg.update(dict(self.speculative_extra))
        return cfg


def resolve_device(device: str, cpu_build: bool | None = None) -> str:
    """``auto`` → ``cpu`` on the CPU build (distribution ``vllm-cpu``), else ``gpu``."""
    if device not in DEVICES:
        raise EngineConfigError(f"device = {device!r} must be one of {DEVICES}")
    if device != "auto":
        return device
    return "cpu" if (is_cpu_build() if cpu_build is None else cpu_build) else "gpu"


def _vllm_cli(python: str) -> list[str]:
    script = Path(python).parent / "vllm"
    if script.exists():
        return [str(script)]
    return [python, "-m", "vllm.entrypoints.cli.main"]


def build_command(config: ServerConfig, port: int, device: str) -> list[str]:
    """The argv that starts the server (``device`` already resolved to cpu/gpu)."""
    if device == "cpu":
        cmd = [config.python, "-m", "tabletune_pipelines.engine.launcher", "serve", config.model]
    else:
        cmd = [*_vllm_cli(config.python), "serve", config.model]
    cmd += [
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", SERVED_MODEL_NAME,
        "--dtype", config.dtype,
        "--max-model-len", str(config.max_model_len),
        "--max-num-seqs", str(config.max_num_seqs),
        "--seed", str(config.seed),
        "--disable-uvicorn-access-log",
    ]
    if config.enforce_eager or device == "cpu":
        cmd.append("--enforce-eager")
    if not config.enable_prefix_caching or device == "cpu":
        cmd.append("--no-enable-prefix-caching")
    if config.step_timing:
        # CPU build: sync scheduling (forced by the platform). GPU: async or sync, decided by vLLM.
        cls = "TimingScheduler" if device == "cpu" else "AutoTimingScheduler"
        cmd += ["--scheduler-cls", f"tabletune_pipelines.engine.step_scheduler.{cls}"]
    spec = config.speculative_config
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    cmd += list(config.extra_args)
    return cmd


def build_env(config: ServerConfig, device: str, work_dir: Path, step_log: Path, control: Path,
              synthetic_control: Path | None = None) -> dict[str, str]:
    """The server's environment: the caller's plus CPU-build settings (CPU only) and TableTune's."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        tmp = work_dir / "tmp"
        cache = work_dir / "vllm-cache"
        tmp.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(cache),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        })
        if synthetic_control is not None and config.synthetic_acceptance_rates is not None:
            env[SYNTHETIC_CONTROL_ENV] = str(synthetic_control)
    if config.step_timing:
        env[STEP_LOG_ENV] = str(step_log)
        env[K_CONTROL_ENV] = str(control)
    env.update({str(k): str(v) for k, v in config.extra_env.items()})
    return env


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
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
        elif _looks_like_path(name):
            raise ModelNotFoundError(f"{what} = {name!r}: no such folder; build it (e.g. ensure_tiny_models) or fix the path")
    if config.method == "draft_model" and config.drafter:
        tv, dv = read_vocab_size(config.model), read_vocab_size(config.drafter)
        if tv is not None and dv is not None and tv != dv:
            raise VocabMismatchError(
                f"drafter {config.drafter!r} has vocab_size {dv} but target {config.model!r} has {tv}; "
                "a draft model must share the target's tokenizer and vocabulary")
    if config.port is not None and not port_is_free(config.port):
        raise PortInUseError(f"port = {config.port} on 127.0.0.1 is already in use; pick another or use port=None")


_LIVE: "weakref.WeakSet[VLLMServer]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter shutdown
    for srv in list(_LIVE):
        try:
            srv.stop()
        except Exception:  # noqa: BLE001
            pass


def _http(url: str, *, data: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class VLLMServer:
    """One vLLM server subprocess. Use as ``with VLLMServer(cfg) as srv: ...``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if config.work_dir:
            self.work_dir = Path(config.work_dir).expanduser().resolve()
            self.work_dir.mkdir(parents=True, exist_ok=True)
        else:
            import tempfile

            self.work_dir = Path(tempfile.mkdtemp(prefix="tabletune-vllm-"))
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.step_log_path: Path | None = None
        self.control_path: Path | None = None
        self.synthetic_control_path: Path | None = None
        self._syn_seq = 0
        self.startup_seconds: float | None = None
        self.last_pgid: int | None = None
        """Process group of the last server started (kept after stop, for checks)."""
        self._ctl_seq = 0
        self._log_fh = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return build_command(self.config, self.port or 0, self.device)

    def start(self) -> "VLLMServer":
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
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115
        self._log_fh.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log_fh.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=str(self.work_dir), start_new_session=True)
        self.last_pgid = self.proc.pid
        _LIVE.add(self)
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.config.startup_timeout
        while True:
            rc = self.proc.poll() if self.proc else None
            if rc is not None:
                raise EngineStartupError(
                    f"vLLM server exited with code {rc} during start-up (log: {self.log_path})", self.log_tail())
            try:
                status, _ = _http(self.base_url + "/health", timeout=2.0)
                if status == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise EngineStartupTimeout(
                    f"vLLM server not healthy after startup_timeout = {self.config.startup_timeout} s "
                    f"(log: {self.log_path})", self.log_tail())
            time.sleep(0.5)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` s. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        rc = proc.poll()
        # start_new_session=True: the server's pid is its process group id.
        pgid = proc.pid
        self.last_pgid = pgid
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        if pgid is not None:
            # Children (engine core, workers) may outlive the API server; kill what is left.
            deadline = time.monotonic() + (5.0 if rc is not None else 0.0)
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.2)
            if _group_alive(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if rc is None:
            rc = proc.wait(timeout=10)
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

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state
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
            status, _ = _http(self.base_url + "/health", timeout=10.0)
        except (OSError, urllib.error.URLError) as exc:
            raise EngineCrashedError(f"vLLM server does not answer /health: {exc!r}", self.log_tail()) from None
        if status != 200:
            raise EngineCrashedError(f"vLLM server /health answered {status}", self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ control
    def set_k(self, k: int | None = None, *, table: Sequence[Sequence[int]] | None = None,
              timeout: float = 30.0) -> None:
        """Switch the draft length at runtime: every batch size uses ``k`` (or the given ``table``).

        The engine applies it after its next step: call this while it is idle or busy, it waits
        for the acknowledgement (the engine core polls the control file once per step; when idle
        a tiny request nudges it).
        """
        if not self.config.step_timing or self.control_path is None:
            raise EngineError("runtime k switching needs step_timing=True")
        if self.config.table is None:
            raise EngineConfigError("runtime k switching needs a launch table (ServerConfig.table)")
        if (k is None) == (table is None):
            raise EngineConfigError("give exactly one of k or table")
        if k is not None and not 0 <= k <= (self.config.num_speculative_tokens or 0):
            raise EngineConfigError(f"k = {k!r} is outside 0..num_speculative_tokens = {self.config.num_speculative_tokens}")
        cmd: dict[str, Any] = {}
        if k is not None:
            cmd["k"] = int(k)
        else:
            cmd["table"] = [list(map(int, r)) for r in validate_vllm_schedule([list(r) for r in table])]
        seq = self._write_control(cmd)
        # The scheduler only polls after a step: one 1-token request makes a step happen.
        self._await_ack(Path(str(self.control_path) + ".ack"), seq, timeout, f"k control {cmd}",
                        poke=lambda: self.complete("k", max_tokens=1), pause=0.05)

    @property
    def can_switch_synthetic_rates(self) -> bool:
        """True when synthetic rates can change at runtime (CPU build + synthetic launch)."""
        return self.device == "cpu" and self.config.synthetic_acceptance_rates is not None

    def set_synthetic_rates(self, rates: Sequence[float], timeout: float = 30.0) -> None:
        """Replace the synthetic acceptance rates at runtime (CPU build, synthetic launch only)."""
        if not self.can_switch_synthetic_rates or self.synthetic_control_path is None:
            raise EngineConfigError("synthetic rates can be switched only on the CPU build in a launch with "
                                    "synthetic_acceptance_rates set")
        K = int(self.config.num_speculative_tokens or 0)
        rates = [float(r) for r in rates]
        if len(rates) != K or any(not 0.0 <= r <= 1.0 for r in rates) or any(
                b > a for a, b in zip(rates, rates[1:])):
            raise EngineConfigError(f"synthetic rates {rates!r} must be {K} non-increasing values in [0, 1]")
        self._syn_seq += 1
        seq = self._syn_seq
        path = self.synthetic_control_path
        self._syn_sig = _write_distinct(path, json.dumps({"seq": seq, "rates": rates}), getattr(self, "_syn_sig", None))
        # The rates are read when drafts are verified: a short request makes that happen.
        self._await_ack(Path(str(path) + ".ack"), seq, timeout, f"synthetic rates {rates}",
                        poke=lambda: self.complete("rates", max_tokens=4, ignore_eos=True), pause=0.02)

    def _await_ack(self, ack_path: Path, seq: int, timeout: float, what: str, *, poke, pause: float) -> None:
        """Wait until the engine acknowledges control message ``seq`` (or reports an error)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ack = json.loads(ack_path.read_text())
            except (OSError, ValueError):
                ack = None
            if ack is not None:
                if ack.get("error"):
                    raise EngineError(f"engine rejected {what}: {ack['error']}", self.log_tail(10))
                if ack.get("ack") == seq:
                    return
            poke()
            time.sleep(pause)
        raise EngineError(f"engine did not acknowledge {what} within {timeout} s", self.log_tail())

    def arm_gate(self, n: int, timeout: float = 10.0) -> None:
        """Hold the next ``n`` arriving requests in the engine and admit them in one step.

        Used by the profiler right before sending a timed batch of n requests (DESIGN §4's 2-core
        trap: otherwise the API server hands them over across several steps). No-op without the
        step scheduler.
        """
        if not self.config.step_timing or self.control_path is None or n <= 1:
            return
        self._write_control({"gate": int(n), "gate_timeout": float(timeout)})

    def _write_control(self, cmd: dict[str, Any]) -> int:
        """Atomically replace the control file with ``cmd`` + a new seq; make sure the engine's
        (inode, mtime, size) check sees a change. Returns the seq."""
        assert self.control_path is not None
        self._ctl_seq += 1
        self._ctl_sig = _write_distinct(self.control_path, json.dumps({"seq": self._ctl_seq, **cmd}),
                                        getattr(self, "_ctl_sig", None))
        return self._ctl_seq

    # ------------------------------------------------------------------ requests
    def complete(self, prompt: str | list[int] | list[str] | list[list[int]], *, max_tokens: int, ignore_eos: bool = False,
                 temperature: float = 0.0, seed: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """One ``/v1/completions`` request (a list of prompts = one batch); returns the decoded JSON answer."""
        body: dict[str, Any] = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": temperature, "ignore_eos": ignore_eos}
        if seed is not None:
            body["seed"] = seed
        try:
            status, raw = _http(self.base_url + "/v1/completions", data=json.dumps(body).encode(), timeout=timeout)
        except (OSError, urllib.error.URLError) as exc:
            self.check_alive()
            raise EngineError(f"completion request failed: {exc!r}", self.log_tail()) from None
        if status != 200:
            raise EngineError(f"completion request answered {status}: {raw[:500]!r}", self.log_tail(10))
        return json.loads(raw)

    def metrics_text(self) -> str:
        status, raw = _http(self.base_url + "/metrics", timeout=10.0)
        if status != 200:
            raise EngineError(f"/metrics answered {status}", self.log_tail(10))
        return raw.decode()

    def version(self) -> str:
        status, raw = _http(self.base_url + "/version", timeout=10.0)
        if status != 200:
            raise EngineError(f"/version answered {status}")
        v = json.loads(raw).get("version", "unknown")
        if self.device == "cpu" and not str(v).endswith("+cpu"):
            v = f"{v}+cpu"
        return str(v)

    def step_log_offset(self) -> int:
        """Current size of the step log: pass as ``offset`` to ``read_steps`` to read only newer records."""
        try:
            return self.step_log_path.stat().st_size if self.step_log_path else 0
        except OSError:
            return 0

    def read_steps(self, since: float | None = None, until: float | None = None,
                   offset: int = 0) -> list[dict[str, Any]]:
        """Step records (see ``step_scheduler``) with ``since <= t <= until`` (time.monotonic()),
        read from byte ``offset`` of the step log on."""
        if not self.step_log_path or not self.step_log_path.exists():
            return []
        out = []
        with open(self.step_log_path) as fh:
            fh.seek(offset)
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                t = rec.get("t", 0.0)
                if (since is None or t >= since) and (until is None or t <= until):
                    out.append(rec)
        return out


def _write_distinct(path: Path, body: str, last_sig: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """Atomically replace ``path`` with ``body`` so that its (inode, mtime, size) differs from
    ``last_sig`` (the engine side detects changes with one stat per step)."""
    tmp = path.with_suffix(".tmp")
    sig = last_sig
    for _ in range(100):
        tmp.write_text(body)
        os.replace(tmp, path)
        st = os.stat(path)
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig != last_sig:
            break
        time.sleep(0.005)  # same inode, size and timestamp tick as the last write: retry
    assert sig is not None
    return sig


def _group_alive(pgid: int) -> bool:
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
