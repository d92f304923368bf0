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
3b. Adaptive re-measurement (``options.remeasure_budget_s``, default 120 s; ``core.remeasure``):
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
)
from tabletune_pipelines.engine.plan import (
    ProfileOptions,
    ProfilePlan,
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
    """Measure T(B, k) for ``config`` (its model, drafter, method and launch K) and return the profile.

    ``options`` (default ``ProfileOptions()``) gives the mode, the warm-up, the server overrides
    and the plan's knobs; ``plan`` replaces the plan built from them. ``hooks``: the cells (and
    mixed-step samples) of an earlier run, kept and not re-measured, and who gets each new one as
    soon as it is measured. ``servers``: running servers to use instead of launching (not stopped),
    and the factory of the launches, which are started and stopped here (one per launch); a server
    that dies raises ``EngineError`` after the cells measured so far were handed to ``on_cell``.
    ``identity`` and ``vocab_size`` default to the config's.

    Mixed steps (``options.mixed_steps``, ``one_launch`` mode): after the decode cells, in the same
    launch, decoding batches with prompts injected (``engine.mixed``); all their samples go to
    ``hooks.on_samples`` at once. ``hooks.existing_samples`` (a rerun) are kept and not measured again.
    """
    options = options or ProfileOptions()
    config = options.apply_to(config)
    plan = plan or plan_from_options(config, options)
    if options.mode == "fixed_k":
        _check_fixed_k(plan, servers)
    target = ProfileTarget(config=config, options=options, plan=plan, identity=identity or engine_identity(config),
                     vocab_size=(read_vocab_size(config.model) or 2048) if vocab_size is None else vocab_size)
    if servers.server is not None:
        _check_given_server(servers.server, plan, target.K)
    run = ProfileRun(target, hooks, servers, progress)
    run.announce()
    reject_ks, accept_ks = run.pending_ks()
    accept_ks = _LAUNCH_STRATEGIES[options.mode](run, reject_ks, accept_ks)
    if any(key[0] is None for key in run.todo):
        _no_spec_launch(run)
    if accept_ks:
        _all_accepted_launch(run, accept_ks)
    return run.measured()


def _check_fixed_k(plan: ProfilePlan, servers: ProfileServers) -> None:
    if servers.server is not None or servers.nospec_server is not None:
        raise EngineConfigError("mode 'fixed_k' launches its own servers (K = k, no table); do not pass "
                                "servers.server / servers.nospec_server")
    if not any(k >= 1 for k in plan.ks):
        raise EngineConfigError(f"mode 'fixed_k' needs some k >= 1 in the plan (got ks = {plan.ks})")


# -- one function per launch strategy: each measures the all-rejected cells of ``reject_ks`` (and
# whatever else its launch can) and returns the k values whose all-accepted cells are still to do.

def _fixed_k_launches(run: ProfileRun, reject_ks: list[int], accept_ks: list[int]) -> list[int]:
    """``fixed_k``: a launch per k >= 1 with K = k and no table (plan.cells("fixed_k") holds k >= 1 only)."""
    for k in reject_ks:
        srv = run.launch(fixed_k_config(run.config, k, run.work))
        try:
            run.group(srv, [k], run.plan.batch_sizes, "reject", False, launch_k=k)
        finally:
            srv.stop()
    return []


def _per_k_launches(run: ProfileRun, reject_ks: list[int], accept_ks: list[int]) -> list[int]:
    """``launch_per_k``: a launch per k, each with the launch K and the table ``[[1, N, k]]``."""
    for k in reject_ks:
        srv = run.launch(per_k_config(run.config, k, run.work))
        try:
            run.group(srv, [k], run.plan.batch_sizes, "reject", False)
        finally:
            srv.stop()
    return accept_ks


def _one_launch(run: ProfileRun, reject_ks: list[int], accept_ks: list[int]) -> list[int]:
    """``one_launch``: every k in one launch whose table lists them all, switched at runtime: the
    all-rejected cells, the adaptive re-measurement, the mixed steps and, where the synthetic rates
    switch at runtime (the CPU build, or a GPU through the timing scheduler), the all-accepted cells.
    A rerun of a complete first pass launches only if a decision is still ambiguous."""
    options, given = run.target.options, run.servers.server
    search = run.adaptive_search and (bool(reject_ks) or run.search_pending(options))
    adaptive = (not run.adaptive_search and options.remeasure_budget_s > 0
                and (bool(reject_ks) or run.remeasure_pending(options)))
    mixed = options.mixed_steps and not run.samples
    if not (reject_ks or adaptive or search or mixed
            or (accept_ks and given is not None and given.can_switch_synthetic_rates)):
        return accept_ks
    srv = given or run.launch(switching_config(run.config, run.plan.ks, 0.0, run.work))
    zeros = [0.0] * run.K
    original_rates = list(srv.config.synthetic_acceptance_rates or zeros)
    try:
        if reject_ks or adaptive or search:
            if srv.can_switch_synthetic_rates and original_rates != zeros:
                srv.set_synthetic_rates(zeros)
            if search:
                run.search(srv, options)
            elif reject_ks:
                run.group(srv, reject_ks, run.plan.batch_sizes, "reject", True)
            if adaptive:
                run.remeasure(srv, options)
        if mixed:
            _mixed_phase(run, srv)
        if accept_ks and srv.can_switch_synthetic_rates:
            srv.set_synthetic_rates([1.0] * run.K)
            run.group(srv, accept_ks, run.plan.accept_batch_sizes, "accept", True)
            accept_ks = []
    finally:
        _release(run, srv, original_rates)
    return accept_ks


_LAUNCH_STRATEGIES: dict[str, Callable[[ProfileRun, list[int], list[int]], list[int]]] = {
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


def _no_spec_launch(run: ProfileRun) -> None:
    """The baseline cells (``k=None``) on a server without speculation."""
    given = run.servers.nospec_server
    srv = given or run.launch(no_spec_config(run.config, run.work))
    try:
        run.group(srv, [None], run.plan.batch_sizes, "reject", False)
    finally:
        if srv is not given:
            srv.stop()


def _all_accepted_launch(run: ProfileRun, accept_ks: list[int]) -> None:
    """The all-accepted cells in a launch with synthetic rates 1 (where they could not be switched to 1 at runtime)."""
    srv = run.launch(switching_config(run.config, [k for k in run.plan.ks if k >= 1], 1.0, run.work))
    try:
        run.group(srv, accept_ks, run.plan.accept_batch_sizes, "accept", True)
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
            got = measure_mixed_steps(srv, k, b, ps, vocab_size=run.vocab_size, seed=cell_seed(b, k, 0, "mixed"))
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
