"""Real-vLLM rig for the controller's engine tests: one server per module, closed-loop load,
published versions written while it serves, and the controller's exported windows read back.

The controller is the only TableTune code in the engine besides the CPU plugin's synthetic
acceptance (``step_timing=False``: no step scheduler), turned on exactly as an operator would:
``--scheduler-cls tabletune_pipelines.controller.scheduler.<class>`` plus the env var
``TABLETUNE_PUBLISHED_TABLE``. Everything the tests assert comes from the controller's own
export file (the live-counters format the pipeline ingests) and the server log.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabletune_pipelines.controller.settings import PUBLISHED_ENV
from tabletune_pipelines.live_counters import CounterWindow, LiveCountersError, read_live_counters
from tests.controller._fake import IDENTITY, LAUNCH, publish

SCHEDULER = "tabletune_pipelines.controller.scheduler."


def tiny():
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    cache = os.environ.get("TABLETUNE_TINY_MODELS") or str(Path(tempfile.gettempdir()) / "tabletune-tiny-models")
    return ensure_tiny_models(cache, "small")


def server_config(work_dir: Path, published: Path, *, method: str = "draft_model", cls: str = "ControllerScheduler",
                  launch=LAUNCH, rates: Sequence[float] | None = (0.7, 0.5, 0.3), extra_env: dict | None = None,
                  max_num_seqs: int = 16, k_max: int = 3, speculative_extra: dict | None = None):
    from tabletune_pipelines.engine import ServerConfig

    m = tiny()
    return ServerConfig(
        model=str(m.target_dir), drafter=str(m.draft_dir) if method == "draft_model" else None, method=method,
        num_speculative_tokens=k_max, table=tuple(launch), synthetic_acceptance_rates=None if rates is None
        else tuple(rates), max_num_seqs=max_num_seqs, max_model_len=512, work_dir=str(work_dir), step_timing=False,
        extra_args=("--scheduler-cls", cls if "." in cls else SCHEDULER + cls), speculative_extra=speculative_extra or {},
        extra_env={PUBLISHED_ENV: str(published), **(extra_env or {})})


def identity(method: str = "draft_model") -> dict[str, Any]:
    m = tiny()
    return dict(IDENTITY, model=str(m.target_dir), drafter=str(m.draft_dir) if method == "draft_model" else None,
                method=method)


@dataclass
class Load:
    """``clients`` closed-loop clients: each sends one request at a time until ``stop()``."""

    server: Any
    clients: int
    prompt: Callable[[random.Random], Any] = lambda rng: [rng.randrange(3, 2000) for _ in range(16)]
    max_tokens: tuple[int, int] = (32, 64)
    temperature: float = 0.0
    ignore_eos: bool = True
    """False for a real model on real prompts: it stops where it would in service."""
    sent: int = 0
    completed: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _run(self, i: int) -> None:
        rng = random.Random(1000 + i)
        while not self._stop.is_set():
            with self._lock:
                self.sent += 1
            try:
                out = self.server.complete(self.prompt(rng), max_tokens=rng.randint(*self.max_tokens),
                                           ignore_eos=self.ignore_eos, temperature=self.temperature, timeout=300.0)
                ok = len(out.get("choices", [])) == 1
                with self._lock:
                    self.completed += int(ok)
                    if not ok:
                        self.errors.append(f"answer without a choice: {str(out)[:200]}")
            except Exception as exc:  # noqa: BLE001 - counted, the test asserts on it
                with self._lock:
                    self.errors.append(repr(exc)[:300])
                time.sleep(0.2)

    def start(self) -> "Load":
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def wait_completed(self, more: int, timeout: float = 180.0) -> int:
        """Block until ``more`` further requests completed (progress, not seconds: a machine 3x slower
        takes 3x longer); ``timeout`` only bounds a stalled engine. Returns the count reached."""
        target = self.completed + more
        deadline = time.monotonic() + timeout
        while self.completed < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.completed} of {target} requests completed after {timeout} s: the engine "
                                     f"stalled (errors: {self.errors[:3]})")
            time.sleep(0.1)
        return self.completed

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=300)


class Rig:
    """One server + its published file + export; publishes versions and waits on the export."""

    def __init__(self, server: Any, published: Path, export: Path, method: str = "draft_model") -> None:
        self.server = server
        self.published = published
        self.export = export
        self.version = 0
        self.method = method

    def publish(self, **kw: Any) -> int:
        self.version += 1
        kw.setdefault("identity", identity(self.method))
        kw.setdefault("allowed_k", [0, 1, 2, 3])
        ctl = {"export_every_steps": 100, "export_every_s": 1.0, **kw.pop("controller", {})}
        publish(self.published, version=self.version, controller=ctl, **kw)
        return self.version

    def serve(self, clients: int, seconds: float, settle: float,
              max_tokens: tuple[int, int] = (48, 96)) -> tuple[list[CounterWindow], Load]:
        """``clients`` closed-loop clients for ``settle`` + ``seconds``: the controller's windows of the
        current version exported after the settle, and the load (its counts)."""
        gen = Load(self.server, clients, max_tokens=max_tokens).start()
        time.sleep(settle)
        mark = len(self.windows())
        time.sleep(seconds)
        gen.stop()
        return [w for w in self.windows()[mark:] if w.table_version == self.version and w.controller], gen

    def steps(self) -> int:
        """The controller's step count in its latest exported window (0 before the first export)."""
        ws = [w for w in self.windows() if w.controller]
        return ws[-1].controller["steps"] if ws else 0

    def wait_steps(self, n: int, timeout: float = 300.0) -> int:
        """Block until the export shows ``n`` more controller steps than now: phases measured in engine
        steps, so a slower machine runs them longer instead of fewer steps. Returns the count reached."""
        target = self.steps() + n
        deadline = time.monotonic() + timeout
        while (now := self.steps()) < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"{now} of {target} controller steps after {timeout} s; log:\n"
                                     f"{self.server.log_tail(30)}")
            time.sleep(0.25)
        return now

    def windows(self) -> list[CounterWindow]:
        try:
            return list(read_live_counters(self.export).windows)
        except LiveCountersError:
            return []

    def wait(self, pred: Callable[[CounterWindow], bool], *, version: int, max_steps: int,
             stall_s: float = 240.0) -> tuple[CounterWindow | None, list[CounterWindow]]:
        """Windows of ``version`` until ``pred`` holds (first such window) or the controller has run
        ``max_steps`` steps under that version (None). Returns (hit, the version's windows).

        Bounded by work, not time: it fails only when no new window arrives for ``stall_s`` seconds
        (a stalled engine), so a machine 3x slower simply takes 3x longer to reach ``max_steps``."""
        last_progress, seen = time.monotonic(), -1
        while time.monotonic() - last_progress < stall_s:
            mine = [w for w in self.windows() if w.table_version == version and w.controller]
            if mine:
                start = mine[0].controller["steps"] - mine[0].steps
                for w in mine:
                    if pred(w):
                        return w, mine
                if mine[-1].controller["steps"] - start >= max_steps:
                    return None, mine
            if len(mine) != seen:
                seen, last_progress = len(mine), time.monotonic()
            time.sleep(0.5)
        raise AssertionError(f"no new window of v{version} for {stall_s} s ({max(seen, 0)} so far, waiting for "
                             f"{max_steps} steps); log:\n{self.server.log_tail(30)}")

    @staticmethod
    def steps_into(w: CounterWindow, mine: list[CounterWindow]) -> int:
        """Steps the controller ran under the version up to the end of window ``w``."""
        return w.controller["steps"] - (mine[0].controller["steps"] - mine[0].steps)

    @staticmethod
    def seconds_into(w: CounterWindow, mine: list[CounterWindow]) -> float:
        return (w.window_end - mine[0].window_start).total_seconds()

    def log(self) -> str:
        return self.server.log_path.read_text(errors="replace") if self.server.log_path else ""
