"""Step-time profiler T(B, k) on the real serving path (docs/method.md, "Step time T(B, k)").

Protocol (``mode="one_launch"``, the default):

1. ONE launch at the launch K whose table lists every k to time (``plan.launch_table``; so k can
   be switched at runtime, and on a GPU every k has its CUDA graphs), synthetic rejection with
   rates 0: every step drafts and verifies in full, every draft is rejected, all B requests
   advance one token per step and finish together.
2. For each batch size B and each k: repetitions of ``cell.measure_cell_once`` (a 1-token and a
   65-token batch of B token-id prompts, engine-side step intervals). With ``warmup`` each
   (k, B) first runs once untimed.
3. ``repetitions`` (3) per cell, the k order rotated per repetition (k0 k1 k3, k1 k3 k0,
   k3 k0 k1) so drift cancels; the cell's value is the median.
3b. Adaptive re-measurement (``options.remeasure_budget_s``, default 120 s, which the adaptive
   plan's added batch sizes draw on too; ``core.remeasure``):
   in the same launch, more repetitions only for the cells behind the batch sizes whose table
   decision the evidence search finds ambiguous (judged under ``options.decision_rates``, or a
   low, middle and high acceptance when none is given), interleaved across k, until every
   decision is settled, the cells reach ``options.max_repetitions`` or the budget is spent. Each
   updated cell goes to ``on_cell`` with all its repetitions, so a rerun continues from them (and
   launches a server for this only if a decision is still ambiguous).
4. A separate no-speculation server gives the baseline cells (``k=None``), and a launch with
   synthetic rates 1 gives "all accepted" cells at a few batch sizes (docs/method.md,
   "Limitations" 2). Where the synthetic rates switch at runtime (the CPU build's plugin; on a GPU
   the timing scheduler, ``engine.gpu_synthetic``) the all-accepted cells are timed in the same launch.

``mode="launch_per_k"`` launches one server per k (same launch K, table ``[[1, N, k]]``).

``mode="fixed_k"`` (the engine-dependence trap, docs/method.md, "Limitations" 1) launches one
server per k >= 1 with ``num_speculative_tokens = k`` and NO table — what a deployment running a
fixed k without Dynamic SD gets. Only reject cells of k >= 1; each has ``launch_k = k``. Store
them under mode ``"fixed_k"`` with the production profile's identity.

Every cell goes to ``hooks.on_cell`` the moment its last repetition is measured, and cells passed in
``hooks.existing`` are skipped, so a rerun after a crash resumes where it stopped (``store_hooks``).

This module holds the protocol's entry point (``profile_step_times``), one function per launch
strategy and ``store_hooks``; one run's inputs and state (``ProfileHooks``, ``ProfileServers``,
``ProfileRun``) are in ``engine.profile_run``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.identity import engine_identity
from tabletune_pipelines.engine.mixed import (
    default_mixed_batch_sizes,
    default_mixed_prefill_tokens,
    measure_mixed_steps,
    mixed_decode_tokens,
)
from tabletune_pipelines.engine.plan import (
    ProfileOptions,
    ProfilePlan,
    context_config,
    fixed_k_config,
    no_spec_config,
    per_k_config,
    plan_from_options,
    switching_config,
)
from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileRun, ProfileServers, ProfileTarget, cell_seed
from tabletune_pipelines.engine.tiny_models import read_vocab_size
from tabletune_pipelines.errors import EngineConfigError
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell, StepTimeProfile

__all__ = ["profile_step_times", "store_hooks"]


def _check_given_server(server: Any, plan: ProfilePlan, K: int) -> None:
    cfg = server.config
    if cfg.table is None or cfg.synthetic_acceptance_rates is None:
        raise EngineConfigError("the given server must be launched with a table and synthetic_acceptance_rates")
    if int(cfg.num_speculative_tokens or 0) != K:
        raise EngineConfigError(f"the given server runs K = {cfg.num_speculative_tokens}, the profile wants K = {K}")
    if not getattr(server, "can_switch_synthetic_rates", False) and any(cfg.synthetic_acceptance_rates):
        raise EngineConfigError(
            f"the given server rejects drafts with rates {list(cfg.synthetic_acceptance_rates)}, not 0, and cannot "
            "switch them at runtime (that needs step_timing): launch it with synthetic_acceptance_rates all 0")
    if getattr(server, "device", "cpu") == "gpu":
        listed = {r[2] for r in cfg.table}
        missing = sorted(set(plan.ks) - listed)
        if missing:
            raise EngineConfigError(
                f"the given server's launch table {[list(r) for r in cfg.table]} lacks k = {missing}: on a GPU "
                "every k to time must be in the launch table (CUDA graphs are captured for those only); launch it "
                "with plan.launch_table(ks, max_num_seqs)")


def profile_step_times(
    config: ServerConfig,
    options: ProfileOptions | None = None,
    *,
    plan: ProfilePlan | None = None,
    hooks: ProfileHooks = ProfileHooks(),
    servers: ProfileServers = ProfileServers(),
    identity: EngineIdentity | None = None,
    vocab_size: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> StepTimeProfile:
    """Measure T(B, k) for ``config`` (its model, drafter, method and launch K) at every context level
    of the plan and return the profile.

    ``options`` (default ``ProfileOptions()``) gives the mode, the warm-up, the server overrides
    and the plan's knobs; ``plan`` replaces the plan built from them. ``hooks``: the cells (and
    mixed-step samples) of an earlier run, kept and not re-measured, and who gets each new one as
    soon as it is measured. ``servers``: running servers to use instead of launching (not stopped),
    and the factory of the launches, which are started and stopped here (one per launch); a server
    that dies raises ``EngineError`` after the cells measured so far were handed to ``on_cell``.
    ``identity`` and ``vocab_size`` default to the config's.

    Context levels: each launch measures its cells at every level of ``plan.context_levels`` in
    turn (one ``ProfileRun`` per level, sharing the launch, its warm-up and k switches); a launch's
    ``max_model_len`` is raised to hold the longest level's requests. The adaptive plan searches the
    first level as without levels and seeds every further level with the boundaries of the level
    below (``ProfileRun.seed_from``); the re-measurement budget is shared out over the levels, what
    one level leaves going to the next. The grid plan measures its whole grid at every level.

    Mixed steps (``options.mixed_steps``, ``one_launch`` mode): after the first level's decode cells,
    in the same launch, decoding batches with prompts injected (``engine.mixed``), their decoding
    requests at the first level; all their samples go to ``hooks.on_samples`` at once.
    ``hooks.existing_samples`` (a rerun) are kept and not measured again.
    """
    options = options or ProfileOptions()
    config = options.apply_to(config)
    plan = plan or plan_from_options(config, options)
    if options.mode == "fixed_k":
        _check_fixed_k(plan, servers)
    config = _fit_context(config, plan, servers)
    target = ProfileTarget(config=config, options=options, plan=plan, identity=identity or engine_identity(config),
                     vocab_size=(read_vocab_size(config.model) or 2048) if vocab_size is None else vocab_size)
    if servers.server is not None:
        _check_given_server(servers.server, plan, target.K)
    runs: list[ProfileRun] = []
    for i, level in enumerate(plan.context_levels):
        at = dataclasses.replace(target, plan=plan.at_level(level))
        runs.append(ProfileRun(at, _level_hooks(hooks, level, first=i == 0), servers, progress,
                               shared=runs[0] if runs else None))
    for run in runs:
        run.announce()
    pending = [run.pending_ks() for run in runs]
    accept = _LAUNCH_STRATEGIES[options.mode](runs, [p[0] for p in pending], [p[1] for p in pending])
    if any(key[0] is None for run in runs for key in run.todo):
        _no_spec_launch(runs)
    if any(accept):
        _all_accepted_launch(runs, accept)
    measured = [run.measured() for run in runs]
    return dataclasses.replace(measured[0], cells=tuple(c for m in measured for c in m.cells))


def _fit_context(config: ServerConfig, plan: ProfilePlan, servers: ProfileServers) -> ServerConfig:
    """``plan.context_config``; a given server too short for the longest level raises
    ``EngineConfigError`` naming the level."""
    fitted = context_config(config, plan)
    for srv in (servers.server, servers.nospec_server):
        have = getattr(getattr(srv, "config", None), "max_model_len", None)
        if isinstance(have, int) and have < fitted.max_model_len:
            raise EngineConfigError(f"context level {plan.context_levels[-1]} needs max_model_len >= "
                                    f"{fitted.max_model_len}; the given server runs {have}: launch it with "
                                    "plan.context_config, or lower context_levels")
    return fitted


def _level_hooks(hooks: ProfileHooks, level: int, *, first: bool) -> ProfileHooks:
    """The hooks of one level's run: the stored cells of that level; the mixed-step samples belong to
    the first level's run (the mixed steps run once, there)."""
    return ProfileHooks(existing=tuple(c for c in hooks.existing if c.context_tokens == level),
                        on_cell=hooks.on_cell,
                        existing_samples=hooks.existing_samples if first else (),
                        on_samples=hooks.on_samples if first else None)


def _check_fixed_k(plan: ProfilePlan, servers: ProfileServers) -> None:
    if servers.server is not None or servers.nospec_server is not None:
        raise EngineConfigError("mode 'fixed_k' launches its own servers (K = k, no table); do not pass "
                                "servers.server / servers.nospec_server")
    if not any(k >= 1 for k in plan.ks):
        raise EngineConfigError(f"mode 'fixed_k' needs some k >= 1 in the plan (got ks = {plan.ks})")


# -- one function per launch strategy: each measures the all-rejected cells of ``reject_ks[i]`` at
# level i (and whatever else its launch can) and returns, per level, the k values whose
# all-accepted cells are still to do.
Pending = list[list[int]]


def _fixed_k_launches(runs: list[ProfileRun], reject_ks: Pending, accept_ks: Pending) -> Pending:
    """``fixed_k``: a launch per k >= 1 with K = k and no table (plan.cells("fixed_k") holds k >= 1 only)."""
    for k in sorted({k for ks in reject_ks for k in ks}):
        srv = runs[0].launch(fixed_k_config(runs[0].config, k, runs[0].work))
        try:
            for run, ks in zip(runs, reject_ks, strict=True):
                if k in ks:
                    run.group(srv, [k], run.plan.batch_sizes, "reject", False, launch_k=k)
        finally:
            srv.stop()
    return [[] for _ in runs]


def _per_k_launches(runs: list[ProfileRun], reject_ks: Pending, accept_ks: Pending) -> Pending:
    """``launch_per_k``: a launch per k, each with the launch K and the table ``[[1, N, k]]``."""
    for k in sorted({k for ks in reject_ks for k in ks}):
        srv = runs[0].launch(per_k_config(runs[0].config, k, runs[0].work))
        try:
            for run, ks in zip(runs, reject_ks, strict=True):
                if k in ks:
                    run.group(srv, [k], run.plan.batch_sizes, "reject", False)
        finally:
            srv.stop()
    return accept_ks


def _one_launch(runs: list[ProfileRun], reject_ks: Pending, accept_ks: Pending) -> Pending:
    """``one_launch``: every k in one launch whose table lists them all, switched at runtime; at each
    context level in turn the all-rejected cells, the adaptive search or re-measurement and, where the
    synthetic rates switch at runtime (the CPU build, or a GPU through the timing scheduler), the
    all-accepted cells; the mixed steps after the first level. A rerun of a complete first pass
    launches only if a decision is still ambiguous."""
    first = runs[0]
    options, given = first.target.options, first.servers.server
    work = [_level_work(run, rk) for run, rk in zip(runs, reject_ks, strict=True)]
    mixed = options.mixed_steps and not first.samples
    switchable = given is not None and given.can_switch_synthetic_rates
    if not (any(reject_ks) or any(any(w) for w in work) or mixed or (any(accept_ks) and switchable)):
        return accept_ks
    srv = given or first.launch(switching_config(first.config, first.plan.ks, 0.0, first.work))
    zeros = [0.0] * first.K
    original_rates = list(srv.config.synthetic_acceptance_rates or zeros)
    left_s = options.remeasure_budget_s
    try:
        for i, (run, rk, (search, adaptive)) in enumerate(zip(runs, reject_ks, work, strict=True)):
            run.budget_s = left_s / (len(runs) - i)  # an even share of what is left; unspent seconds go on
            if rk or adaptive or search:
                if srv.can_switch_synthetic_rates and list(srv.config.synthetic_acceptance_rates or zeros) != zeros:
                    srv.set_synthetic_rates(zeros)
                if search and i > 0:
                    run.seed_from(runs[i - 1])
                if search:
                    run.search(srv, options)
                elif rk:
                    run.group(srv, rk, run.plan.batch_sizes, "reject", True)
                if adaptive:
                    run.remeasure(srv, options)
                left_s = max(0.0, left_s - run.spent_s())
            if i == 0 and mixed:
                _mixed_phase(run, srv)
            if accept_ks[i] and srv.can_switch_synthetic_rates:
                srv.set_synthetic_rates([1.0] * run.K)
                run.group(srv, accept_ks[i], run.plan.accept_batch_sizes, "accept", True)
                accept_ks[i] = []
    finally:
        _release(first, srv, original_rates)
    return accept_ks


def _level_work(run: ProfileRun, reject_ks: list[int]) -> tuple[bool, bool]:
    """(whether the adaptive search has something to measure at this level, whether the re-measurement of
    the grid plan has)."""
    options = run.target.options
    search = run.adaptive_search and (bool(reject_ks) or run.search_pending(options))
    adaptive = (not run.adaptive_search and options.remeasure_budget_s > 0
                and (bool(reject_ks) or run.remeasure_pending(options)))
    return search, adaptive


_LAUNCH_STRATEGIES: dict[str, Callable[[list[ProfileRun], Pending, Pending], Pending]] = {
    "one_launch": _one_launch, "launch_per_k": _per_k_launches, "fixed_k": _fixed_k_launches}


def _release(run: ProfileRun, srv: Any, original_rates: list[float]) -> None:
    """Stop a server launched here; leave a given one as it was found (its rates and K restored)."""
    given = run.servers.server
    if given is not None and srv is given:
        if given.can_switch_synthetic_rates and given.is_alive():
            given.set_synthetic_rates(original_rates)
            run.switch_k(given, run.K)
    else:
        srv.stop()


def _no_spec_launch(runs: list[ProfileRun]) -> None:
    """The baseline cells (``k=None``) on a server without speculation, every level in it."""
    given = runs[0].servers.nospec_server
    srv = given or runs[0].launch(no_spec_config(runs[0].config, runs[0].work))
    try:
        for run in runs:
            run.group(srv, [None], run.plan.batch_sizes, "reject", False)
    finally:
        if srv is not given:
            srv.stop()


def _all_accepted_launch(runs: list[ProfileRun], accept_ks: Pending) -> None:
    """The all-accepted cells in a launch with synthetic rates 1 (where they could not be switched to 1
    at runtime), every level in it."""
    first = runs[0]
    srv = first.launch(switching_config(first.config, [k for k in first.plan.ks if k >= 1], 1.0, first.work))
    try:
        for run, ks in zip(runs, accept_ks, strict=True):
            if ks:
                run.group(srv, ks, run.plan.accept_batch_sizes, "accept", True)
    finally:
        srv.stop()


def _mixed_phase(run: ProfileRun, srv: Any) -> None:
    """Mixed steps at every k of the plan and the mixed batch sizes (``engine.mixed``), all handed
    to ``on_samples`` at once."""
    zeros = [0.0] * run.K
    if srv.can_switch_synthetic_rates and list(srv.config.synthetic_acceptance_rates or zeros) != zeros:
        srv.set_synthetic_rates(zeros)
    config, options, plan = run.config, run.target.options, run.plan
    sizes = list(options.mixed_batch_sizes or default_mixed_batch_sizes(plan.batch_sizes, config.max_num_seqs))
    ps = list(options.mixed_prefill_tokens or default_mixed_prefill_tokens(
        config.max_model_len, run.target.identity.capture_ceiling, plan.prompt_tokens))
    ps = [p for p in ps if p + 1 <= config.max_model_len]
    ks = [k for k in plan.ks if k is not None]
    t0 = time.monotonic()
    run.prog.say(f"[profile] mixed steps: k {ks} x B {sizes}, injected prompts of {ps} tokens")
    out: list[StepSample] = []
    for i, b in enumerate(sizes):
        for k in ks[i % len(ks):] + ks[: i % len(ks)]:
            srv.set_k(k)  # every time (a switch to the same k is harmless)
            run.k_set[id(srv)] = k
            run.warm(srv, k, b)
            got = measure_mixed_steps(srv, k, b, ps, vocab_size=run.vocab_size, seed=cell_seed(b, k, 0, "mixed"),
                                      decode_tokens=mixed_decode_tokens(plan.decode_steps))
            out.extend(got)
            run.prog.say(f"[profile] mixed k={k} B={b}: {sum(1 for s in got if s.prefill_tokens)} mixed steps, "
                         f"{sum(1 for s in got if not s.prefill_tokens)} decode steps")
    run.prog.say(f"[profile] mixed steps done: {len(out)} samples in {time.monotonic() - t0:.0f} s")
    run.samples = out
    if run.hooks.on_samples is not None:
        run.hooks.on_samples(out)


def store_hooks(store: Any, identity: EngineIdentity, mode: str) -> ProfileHooks:
    """``hooks`` for ``profile_step_times`` backed by a ``TableTuneStore``: the cells and mixed-step
    samples stored for ``identity`` in profile mode ``mode``, and writers of each new one."""

    def on_cell(cell: StepTimeCell) -> None:
        store.write_profile_cell(identity, cell, mode)

    def on_samples(samples: list[StepSample]) -> None:
        store.write_step_samples(identity, samples, mode)

    return ProfileHooks(existing=tuple(store.profile_cells(identity.key, mode)), on_cell=on_cell,
                        existing_samples=tuple(store.step_samples(identity.key, mode)), on_samples=on_samples)
