"""The live-engine rig: one real vLLM server running the controller, its closed-loop load, published
versions written while it serves, and the controller's exported windows read back.

Used by the controller's engine tests and by the benchmarks that measure the controller on a real
engine (controller_overhead.py, controller_repair.py, controller_flapping.py, gpu_controller.py).
The controller is turned on exactly as an operator would: ``--scheduler-cls
tabletune_pipelines.controller.scheduler.<class>`` plus the env var ``TABLETUNE_PUBLISHED_TABLE``
(``server_config``). Everything read back comes from the controller's own export file (the
live-counters format the pipeline ingests) and the server log.

``server_config`` defaults to the tiny CPU models (``engine.tiny_models``) with synthetic acceptance
and no timing scheduler (``step_timing=False``); the synthetic inputs it publishes come from
``evaluation.synthetic``. The load is ``tuning.served_load.LoadGenerator`` with the rig's settings
(``closed_loop``). No vLLM import here: the engine package is imported when a config is built.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tabletune_pipelines.controller.loader import default_export_path
from tabletune_pipelines.errors import LiveCountersError
from tabletune_pipelines.evaluation.synthetic import IDENTITY, LAUNCH, publish
from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
from tabletune_pipelines.formats.live_counters import CounterWindow, read_live_counters
from tabletune_pipelines.formats.published_files import check_published_target
from tabletune_pipelines.tuning.served_load import LoadGenerator
from tabletune_pipelines.vocab import Method

__all__ = ["SCHEDULER", "Rig", "closed_loop", "drafting_requests_per_step", "identity", "server_config", "tiny"]

SCHEDULER = "tabletune_pipelines.controller.scheduler."
"""The production plugin's module: ``server_config(cls=...)`` prefixes a bare class name with it."""


def tiny():
    """The tiny CPU target and draft models (``engine.tiny_models``, the "small" pair), made once in
    ``$TABLETUNE_TINY_MODELS`` or the temp folder."""
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    cache = os.environ.get("TABLETUNE_TINY_MODELS") or str(Path(tempfile.gettempdir()) / "tabletune-tiny-models")
    return ensure_tiny_models(cache, "small")


def server_config(work_dir: Path, published: Path, *, method: Method = "draft_model",
                  cls: str = "ControllerScheduler",
                  launch=LAUNCH, rates: Sequence[float] | None = (0.7, 0.5, 0.3), extra_env: dict | None = None,
                  max_num_seqs: int = 16, k_max: int = 3, speculative_extra: dict | None = None):
    """The tiny models' ``engine.ServerConfig`` with the scheduler plugin ``cls`` (a bare name is a
    class of ``controller.scheduler``) reading the published file ``published``."""
    from tabletune_pipelines.engine import ServerConfig

    m = tiny()
    return ServerConfig(
        model=str(m.target_dir), drafter=str(m.draft_dir) if method == "draft_model" else None, method=method,
        num_speculative_tokens=k_max, table=tuple(launch), synthetic_acceptance_rates=None if rates is None
        else tuple(rates), max_num_seqs=max_num_seqs, max_model_len=512, work_dir=str(work_dir), step_timing=False,
        extra_args=("--scheduler-cls", cls if "." in cls else SCHEDULER + cls),
        speculative_extra=speculative_extra or {},
        extra_env={PUBLISHED_ENV: str(published), **(extra_env or {})})


def identity(method: str = "draft_model") -> dict[str, Any]:
    """``synthetic.IDENTITY`` with the tiny models' paths: the identity the rig's engine reports."""
    m = tiny()
    return dict(IDENTITY, model=str(m.target_dir), drafter=str(m.draft_dir) if method == "draft_model" else None,
                method=method)


def closed_loop(server: Any, clients: int, *, prompt: Callable[[random.Random], Any] | None = None,
                max_tokens: tuple[int, int] = (32, 64), temperature: float = 0.0,
                ignore_eos: bool = True) -> LoadGenerator:
    """``clients`` closed-loop clients against ``server`` (not started): ``served.LoadGenerator`` with
    the rig's settings: prompts of 16 random token ids in [3, 2000) unless ``prompt``, client i seeded
    1000 + i, an answer counted only with exactly one choice, 300 s per request."""
    return LoadGenerator(server, clients, vocab_size=2000, prompt_tokens=16, output_tokens=max_tokens, prompt=prompt,
                         first_seed=1000, ignore_eos=ignore_eos, temperature=temperature, one_choice=True,
                         request_timeout_s=300.0, retry_pause_s=0.2, error_chars=300)


def drafting_requests_per_step(windows: Sequence[CounterWindow]) -> float:
    """Requests that drafted, per engine step, over the controller's exported ``windows`` (NaN with
    no step): each drafting request is one draft (``num_drafts``) a step. With every batch size
    drafting it is the batch the engine ran; far below the clients' count, the engine served one
    request at a time while they had more in flight (docs/engine-facts.md, "Spells of one request")."""
    steps = sum(w.steps or 0 for w in windows)
    return sum(w.num_drafts for w in windows) / steps if steps else float("nan")



def _controller_steps(w: CounterWindow) -> int:
    """The controller's step count at the end of window ``w`` (the rig reads only windows with the
    controller's state)."""
    if w.controller is None:
        raise LiveCountersError(f"window of v{w.table_version} has no controller state")
    return int(w.controller["steps"])


def _steps_before(first: CounterWindow) -> int:
    """The controller's step count before window ``first`` (a version's first window) began."""
    if first.steps is None:
        raise LiveCountersError(f"window of v{first.table_version} does not count its steps")
    return _controller_steps(first) - first.steps

class Rig:
    """One server + its published file + export; publishes versions and waits on the export.

    ``export`` None: the controller's default export path beside the published file. Versions go on
    from the one the published file holds (0 without one): a server another rig published to
    installs only newer versions."""

    def __init__(self, server: Any, published: Path, export: Path | None = None, method: str = "draft_model",
                 deployment: str = "test") -> None:
        self.server = server
        self.published = published
        self.export = default_export_path(published) if export is None else export
        self.version = check_published_target(published)
        self.method = method
        self.deployment = deployment

    def publish(self, **kw: Any) -> int:
        """The next version (``synthetic.publish``; by default the rig's identity and deployment, every k
        allowed, an export every 100 steps or second). Returns its version number."""
        self.version += 1
        kw.setdefault("identity", identity(self.method))
        kw.setdefault("deployment", self.deployment)
        kw.setdefault("allowed_k", [0, 1, 2, 3])
        ctl = {"export_every_steps": 100, "export_every_s": 1.0, **kw.pop("controller", {})}
        publish(self.published, version=self.version, controller=ctl, **kw)
        return self.version

    def serve(self, clients: int, seconds: float, settle: float,
              max_tokens: tuple[int, int] = (48, 96)) -> tuple[list[CounterWindow], LoadGenerator]:
        """``clients`` closed-loop clients for ``settle`` + ``seconds``: the controller's windows of the
        current version exported after the settle, and the load (its counts)."""
        gen = closed_loop(self.server, clients, max_tokens=max_tokens).start()
        time.sleep(settle)
        mark = len(self.windows())
        time.sleep(seconds)
        gen.stop()
        return [w for w in self.windows()[mark:] if w.table_version == self.version and w.controller], gen

    def steps(self) -> int:
        """The controller's step count in its latest exported window (0 before the first export)."""
        ws = [w for w in self.windows() if w.controller]
        return _controller_steps(ws[-1]) if ws else 0

    def wait_steps(self, n: int, timeout: float = 300.0) -> int:
        """Block until the export shows ``n`` more controller steps than now: phases measured in engine
        steps, so a slower machine runs them longer instead of fewer steps. ``timeout`` is a stall
        guard: the longest wait with no new step exported (an AVX2-only machine on the float32 path
        runs 2-4 steps/s where a native-bf16 one runs ~9, so a limit on the whole phase would fail
        there). Returns the count reached."""
        target = self.steps() + n
        seen, since = self.steps(), time.monotonic()
        while (now := self.steps()) < target:
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > timeout:
                raise AssertionError(f"{now} of {target} controller steps, none new for {timeout} s; log:\n"
                                     f"{self.server.log_tail(30)}")
            time.sleep(0.25)
        return now

    def windows(self) -> list[CounterWindow]:
        """Every window the controller exported so far (none while the file is missing or unreadable)."""
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
                start = _steps_before(mine[0])
                for w in mine:
                    if pred(w):
                        return w, mine
                if _controller_steps(mine[-1]) - start >= max_steps:
                    return None, mine
            if len(mine) != seen:
                seen, last_progress = len(mine), time.monotonic()
            time.sleep(0.5)
        raise AssertionError(f"no new window of v{version} for {stall_s} s ({max(seen, 0)} so far, waiting for "
                             f"{max_steps} steps); log:\n{self.server.log_tail(30)}")

    @staticmethod
    def steps_into(w: CounterWindow, mine: list[CounterWindow]) -> int:
        """Steps the controller ran under the version up to the end of window ``w``."""
        return _controller_steps(w) - _steps_before(mine[0])

    @staticmethod
    def seconds_into(w: CounterWindow, mine: list[CounterWindow]) -> float:
        """Seconds from the start of the version's first window to the end of ``w``."""
        return (w.window_end - mine[0].window_start).total_seconds()

    def log(self) -> str:
        """The server's whole log ("" without one)."""
        return self.server.log_path.read_text(errors="replace") if self.server.log_path else ""
