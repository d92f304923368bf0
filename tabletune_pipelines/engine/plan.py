"""What a profile measures, and the launches that measure it.

``ProfileOptions`` is what a caller asks for (the CLI, the pipeline, a benchmark): typed, with
a default per field. ``plan_from_options`` turns it plus a ``ServerConfig`` into a ``ProfilePlan``
(batch sizes, k values, repetitions, which extra cells); the fields the two share are declared once,
in ``PlanFields``, and the server settings a measurement may override once, in ``LaunchOverrides``
(``deployments.AcceptanceOptions`` builds on it too). The ``*_config`` functions build the
``ServerConfig`` of each launch the plan needs (docs/method.md, "Step time T(B, k)").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tabletune_pipelines.core.evidence import ACCEPTED_LOSS
from tabletune_pipelines.core.goodput import validate_acceptance
from tabletune_pipelines.core.remeasure import COARSE_POINTS, DEFAULT_MAX_REPETITIONS, coarse_batch_sizes
from tabletune_pipelines.core.steptime import DEFAULT_DECODE_STEPS, LONG_MAX_TOKENS, batch_size_grid
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.errors import EngineConfigError
from tabletune_pipelines.options import Bound, context_levels_problem, options_from_mapping
from tabletune_pipelines.vocab import DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS, PROFILE_MODES, ProfileMode

#: Default seconds of adaptive re-measurement after the first pass.
DEFAULT_REMEASURE_BUDGET_S = 120.0

#: The range of every number ``ProfileOptions`` holds, as ``options.Bound``s (the rule of every number
#: read from outside: NaN, infinity and a bool are refused by name). One validation: ``ProfileOptions``,
#: ``ProfilePlan`` and ``deployments.AcceptanceOptions`` check their fields with ``limit_problem``
#: (through ``PlanFields`` and ``LaunchOverrides``), and so do the CLI's ``profile`` options
#: (``--repetitions``, ``--max-repetitions``, ``--remeasure-budget``, ``--startup-timeout``), so a
#: value that could not be meant (10^12 repetitions, a 1e300 s budget) is refused by name before an
#: engine starts or the store is touched.
PROFILE_LIMITS: dict[str, Bound] = {
    "repetitions": Bound(1, 100, integer=True, why="repetitions per cell; 100 make the median ~6x tighter than 3, "
                                                   "more only make the profile take hours"),
    "max_repetitions": Bound(1, 100, integer=True, why="the most repetitions re-measurement gives a cell"),
    "prompt_tokens": Bound(1, 32_768, integer=True, why="tokens of each timing prompt; the profile times decode "
                                                        "steps"),
    "remeasure_budget_s": Bound(0.0, 86_400.0, why="seconds of re-measurement, 0 = off; at most a day"),
    "startup_timeout": Bound(1.0, 3_600.0, why="seconds a launch may take to become healthy; a cold GPU launch "
                                               "with CUDA graphs takes 2-3 minutes, a slow CPU several"),
    "kv_cache_space_gib": Bound(1, 4_096, integer=True, why="GiB of CPU memory for the KV cache"),
    "max_model_len": Bound(1, 2 ** 24, integer=True, why="tokens of context"),
    "accepted_loss": Bound(0.0, 0.5, why="the goodput loss a tie may leave, 0.01 = 1 %"),
    "decode_steps": Bound(8, 1_024, integer=True, why="decode steps timed per repetition; fewer than 8 leave the "
                                                      "engine timing too few steady steps"),
    "coarse_points": Bound(2, 64, integer=True, why="batch sizes of the adaptive plan's first pass, the grid's "
                                                    "first and last among them"),
}

#: How a profile picks its batch sizes: ``adaptive`` (coarse batch sizes, then bisection where the
#: best k changes; ``core.remeasure.search_boundaries``) or ``grid`` (every batch size of the grid).
PLAN_SEARCHES = ("adaptive", "grid")


def limit_problem(name: str, value: Any) -> str | None:
    """None when ``value`` is within ``PROFILE_LIMITS[name]``, else what it must be (the text after
    ``name = value``): ``options.Bound.problem``."""
    return PROFILE_LIMITS[name].problem(value)


def check_limit(name: str, value: Any) -> None:
    """``EngineConfigError`` naming ``name`` and ``value`` unless ``value`` is within its limits."""
    problem = limit_problem(name, value)
    if problem:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:24]}... ({len(repr(value))} characters)"
        raise EngineConfigError(f"{name} = {shown} {problem}")


def check_in_range(label: str, values: Iterable[int] | None, low: int, high_name: str, high: int,
                   where: str = "") -> None:
    """Every value in ``low..high``, else ``EngineConfigError``: ``"batch size 99 is outside
    1..max_num_seqs = 16"`` + ``where``. The batch sizes and k values of options and plans, checked
    against an engine by this one rule (the CLI before anything starts, the plan when it is built)."""
    for v in values or ():
        if not low <= v <= high:
            raise EngineConfigError(f"{label} {v} is outside {low}..{high_name} = {high}{where}")

CellKey = tuple[int | None, int, str]
"""(k, batch size, acceptance) of one cell; k None is the no-speculation baseline."""
T = TypeVar("T")


def _ints(name: str, values: Iterable[Any] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise EngineConfigError(f"{name} = {values!r} must be a list of integers")
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise EngineConfigError(f"{name} = {list(values)!r}: {v!r} is not an integer")
        out.append(int(v))
    return tuple(out)


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise EngineConfigError(f"{name} = {value!r} must be true or false")


@dataclass(frozen=True)
class LaunchOverrides:
    """The server settings a measurement's options may set on the ``ServerConfig`` it launches (one
    home: ``ProfileOptions`` and ``deployments.AcceptanceOptions`` both build on it). None = the
    ServerConfig's own value; a value is checked against ``PROFILE_LIMITS``."""

    startup_timeout: float | None = None
    """Server start-up timeout in seconds (1..3600); None = the ServerConfig's."""
    kv_cache_space_gib: int | None = None
    """``VLLM_CPU_KVCACHE_SPACE``: GiB of CPU memory for the KV cache (CPU build); None = the ServerConfig's."""
    max_model_len: int | None = None
    """Context length of the measurement launches, in tokens; None = the ServerConfig's."""

    def __post_init__(self) -> None:
        for name in _names(LaunchOverrides):
            if getattr(self, name) is not None:
                check_limit(name, getattr(self, name))

    def server_overrides(self) -> dict[str, Any]:
        """The ServerConfig fields these options set (only those not None)."""
        return {n: getattr(self, n) for n in _names(LaunchOverrides) if getattr(self, n) is not None}

    def apply_to(self, config: ServerConfig) -> ServerConfig:
        """``config`` with the server overrides applied."""
        overrides = self.server_overrides()
        return dataclasses.replace(config, **overrides) if overrides else config


@dataclass(frozen=True)
class PlanFields:
    """What a profile measures, each field declared once: ``ProfileOptions`` asks for it (None = the
    default each field names, resolved against the launch by ``plan_from_options``) and a
    ``ProfilePlan`` holds it resolved."""

    batch_sizes: tuple[int, ...] | None = None
    """Batch sizes of the reject cells; None = ``batch_size_grid(max_num_seqs)`` (1..16, then every 8)."""
    ks: tuple[int, ...] | None = None
    """Draft lengths timed under the launch K; None = 0..K."""
    repetitions: int = DEFAULT_REPETITIONS
    """Repetitions per cell (the cell is their median; the k order rotates per repetition); 1..100
    (``PROFILE_LIMITS`` holds every number's range)."""
    include_no_spec: bool = True
    """Also time the no-speculation server (k = None cells) at every batch size (one more launch)."""
    accept_batch_sizes: tuple[int, ...] | None = None
    """Batch sizes of the all-accepted cells (synthetic rates 1, k >= 1 only); None = the smallest,
    middle and largest of ``batch_sizes``; () = none."""
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    """Prompt length of the timing requests, in tokens (sent as token ids): the context level of a
    plan that names no ``context_levels``."""
    context_levels: tuple[int, ...] | None = None
    """Context levels in tokens, ascending: every cell is measured at each, its requests' prompts
    exactly that long, so the KV length of the timed decode steps is held there (``propose_context_levels``
    spans a deployment's context); None = one level, ``prompt_tokens`` (a profile as without levels)."""
    decode_steps: int = DEFAULT_DECODE_STEPS
    """Decode steps a repetition times: its long batch generates this many tokens after the first
    (``max_tokens`` = 1 + this); 8..1024. Fewer steps make a repetition shorter and its value
    noisier; the repetitions estimate that noise, so the evidence rule asks for more where it matters."""

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "ks", "accept_batch_sizes", "context_levels"):
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        check_limit("repetitions", self.repetitions)
        check_limit("prompt_tokens", self.prompt_tokens)
        check_limit("decode_steps", self.decode_steps)
        if self.context_levels is not None:
            check_context_levels(self.context_levels)
        _check_bool("include_no_spec", self.include_no_spec)

    def check_engine(self, max_num_seqs: int, max_k: int, where: str = "") -> None:
        """The batch sizes (and all-accepted batch sizes) within 1..max_num_seqs and the k values
        within 0..max_k of an engine, else ``EngineConfigError`` naming the value (``where``: whose
        limits, e.g. a fleet deployment). The one rule: options are checked with it before an engine
        starts or the store is opened, and a plan when it is built."""
        check_in_range("batch size", self.batch_sizes, 1, "max_num_seqs", max_num_seqs, where)
        check_in_range("k =", self.ks, 0, "num_speculative_tokens", max_k, where)
        check_in_range("accept batch size", self.accept_batch_sizes, 1, "max_num_seqs", max_num_seqs, where)


@dataclass(frozen=True)
class ProfilePlan(PlanFields):
    """What to measure: ``PlanFields`` resolved (``batch_sizes`` and ``ks`` given, non-empty)."""

    if TYPE_CHECKING:  # what __post_init__ guarantees, for the type checker (no new fields at run time)
        batch_sizes: tuple[int, ...] = ()
        ks: tuple[int, ...] = ()
        accept_batch_sizes: tuple[int, ...] = ()
        context_levels: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context_levels is None:
            object.__setattr__(self, "context_levels", (self.prompt_tokens,))
        if self.batch_sizes is None or self.ks is None:
            raise EngineConfigError("a ProfilePlan holds its batch sizes and ks; plan_from_options resolves None "
                                    "against the launch")
        if not self.batch_sizes:
            raise EngineConfigError("batch_sizes is empty; give at least one batch size or None for the default grid")
        if not self.ks:
            raise EngineConfigError("ks is empty; give at least one k or None for 0..K")
        if self.accept_batch_sizes is None:
            bs = sorted(set(self.batch_sizes))
            object.__setattr__(self, "accept_batch_sizes", tuple(sorted({bs[0], bs[len(bs) // 2], bs[-1]})))

    def at_level(self, level: int) -> ProfilePlan:
        """The plan of one context level: its cells' prompts ``level`` tokens long."""
        if level not in self.context_levels:
            raise EngineConfigError(f"context level {level} is not one of the plan's {list(self.context_levels)}")
        return dataclasses.replace(self, prompt_tokens=level, context_levels=(level,))

    def level_cells(self, mode: str) -> list[tuple[int, CellKey]]:
        """Every (context level, cell) of a plan that measures its whole grid at every level (the grid
        plan; the adaptive plan picks the batch sizes of each level as it goes), in measuring order."""
        return [(level, key) for level in self.context_levels for key in self.cells(mode)]

    def cells(self, mode: str) -> list[CellKey]:
        """Every cell of the plan under ``mode`` at one context level, in measuring order."""
        if mode == "fixed_k":
            # Launches with K = k and no table: k >= 1 only, no baseline, no all-accepted cells.
            return [(k, b, "reject") for b in self.batch_sizes for k in self.ks if k >= 1]
        keys: list[CellKey] = [(k, b, "reject") for b in self.batch_sizes for k in self.ks]
        if self.include_no_spec:
            keys += [(None, b, "reject") for b in self.batch_sizes]
        keys += [(k, b, "accept") for b in self.accept_batch_sizes for k in self.ks if k >= 1]
        return keys


@dataclass(frozen=True)
class ProfileOptions(PlanFields, LaunchOverrides):
    """How to profile: what to measure (``PlanFields``), the launch mode, the server settings
    (``LaunchOverrides``) and re-measurement.

    Every field has a default, so ``ProfileOptions()`` is the method's protocol on the
    deployment's own grid. ``from_mapping`` reads the same fields from a dict (a fleet file, a
    Dagster run config) and names any key it does not know.
    """

    mode: ProfileMode = "one_launch"
    """``one_launch`` (every k in one launch, switched at runtime), ``launch_per_k`` or
    ``fixed_k`` (a launch per k >= 1 with K = k and no table: the engine-dependence baseline)."""
    fixed_k_baseline: bool = False
    """Also time every k >= 1 in its own launch with K = k and no table, at four batch sizes
    (the engine-dependence check's baseline, docs/method.md, "Limitations" 1). Run by the caller
    with ``fixed_k_baseline_options``."""
    fixed_k_ks: tuple[int, ...] | None = None
    """The k the fixed-k baseline launches (each one of the plan's k >= 1); None = every k >= 1 of
    the plan. Each is a launch: fewer k cost fewer launches, and the engine-dependence check then
    compares the table with the best of these only."""
    warmup: bool | None = None
    """Run each (k, B) once untimed before its first timing; None = on a GPU yes (new batch
    shapes JIT-compile kernels there: docs/engine-facts.md, "GPU (H200, vLLM 0.26)"), on the CPU
    build no."""
    remeasure_budget_s: float = DEFAULT_REMEASURE_BUDGET_S
    """Seconds of measurement after the first pass (``one_launch`` mode), shared out over the
    context levels: more repetitions only for the cells behind decisions the evidence search finds
    ambiguous (``core.remeasure``) and, in the adaptive plan, the batch sizes its bisection and
    verification add (``core.remeasure.search_boundaries``); 0 turns both off."""
    max_repetitions: int = DEFAULT_MAX_REPETITIONS
    """No cell gets more repetitions than this through re-measurement."""
    decision_rates: tuple[float, ...] | None = None
    """Acceptance rates a_1..a_K under which decisions are judged for re-measurement; None = a low,
    a middle and a high geometric profile (``core.remeasure.DEFAULT_DECISION_RATES``)."""
    plan_search: str = "adaptive"
    """``adaptive`` (``one_launch`` mode): the grid's coarse batch sizes first, then bisection between
    neighbours whose best k differ and a check at the midpoint of every run of equal decisions, the
    cells repeated until their decisions are settled or tied within ``accepted_loss`` (or the
    re-measurement budget is spent: ``core.remeasure.search_boundaries``); ``grid``: every batch
    size of ``batch_sizes`` with ``repetitions`` each, then the re-measurement."""
    coarse_points: int = COARSE_POINTS
    """Batch sizes of the adaptive plan's first pass, spread evenly over the grid with its first and
    last among them (``core.remeasure.coarse_batch_sizes``); 2..64."""
    accepted_loss: float = ACCEPTED_LOSS
    """Candidate k whose goodput gain over the chosen one is bounded by this (at the evidence rule's
    confidence) are tied: a tie keeps the incumbent and needs no more repetitions."""
    mixed_steps: bool = True
    """Also time mixed steps (a decoding batch plus injected prompts, ``engine.mixed``) in the
    ``one_launch`` launch, for the served step-cost fit (``core.stepcost``)."""
    mixed_batch_sizes: tuple[int, ...] | None = None
    """Batch sizes of the mixed steps; None = smallest, middle and largest of the grid, the largest
    one below max_num_seqs (``engine.mixed.default_mixed_batch_sizes``)."""
    mixed_prefill_tokens: tuple[int, ...] | None = None
    """Prompt lengths injected into the decoding batches; None = ½×, 2× and 8× ``prompt_tokens``
    and, with CUDA graphs, the capture ceiling (``engine.mixed.default_mixed_prefill_tokens``)."""

    def __post_init__(self) -> None:
        PlanFields.__post_init__(self)
        LaunchOverrides.__post_init__(self)
        if self.mode not in PROFILE_MODES:
            raise EngineConfigError(f"mode = {self.mode!r} must be one of {PROFILE_MODES}")
        for name in ("mixed_batch_sizes", "mixed_prefill_tokens", "fixed_k_ks"):
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        if self.fixed_k_ks is not None and (not self.fixed_k_ks or not all(1 <= k <= 64 for k in self.fixed_k_ks)):
            raise EngineConfigError(f"fixed_k_ks = {list(self.fixed_k_ks)!r}: give draft lengths k in 1..64 (the "
                                    "launches of the fixed-k baseline), or null for every k >= 1 of the plan")
        for name in ("remeasure_budget_s", "max_repetitions", "accepted_loss", "coarse_points"):
            check_limit(name, getattr(self, name))
        if self.plan_search not in PLAN_SEARCHES:
            raise EngineConfigError(f"plan_search = {self.plan_search!r} must be one of {PLAN_SEARCHES}")
        for name in ("mixed_batch_sizes", "mixed_prefill_tokens"):
            bad = [v for v in getattr(self, name) or () if not 1 <= v <= 1_000_000]
            if bad or getattr(self, name) == ():
                raise EngineConfigError(f"{name} = {list(getattr(self, name))!r}: give positive token counts / batch "
                                        "sizes (at most 1000000), or null for the default; mixed_steps: false turns "
                                        "the mixed steps off")
        for name in ("fixed_k_baseline", "mixed_steps"):
            _check_bool(name, getattr(self, name))
        if self.warmup is not None and not isinstance(self.warmup, bool):
            raise EngineConfigError(f"warmup = {self.warmup!r} must be true, false or null (device default)")
        if self.decision_rates is not None:
            try:
                rates = tuple(float(r) for r in self.decision_rates)
                validate_acceptance(rates, name="decision_rates")
            except (TypeError, ValueError) as exc:
                raise EngineConfigError(f"decision_rates = {self.decision_rates!r}: {exc}") from None
            object.__setattr__(self, "decision_rates", rates)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "profile options") -> ProfileOptions:
        """Options from a dict (``options.options_from_mapping``); an unknown key or a bad value raises
        ``EngineConfigError`` naming it and ``where``."""
        return options_from_mapping(cls, data, where=where, error=EngineConfigError)

    def warmup_for(self, device: str) -> bool:
        """The warm-up setting on a resolved device (``cpu`` / ``gpu``)."""
        return (device == "gpu") if self.warmup is None else self.warmup


def check_context_levels(levels: Sequence[int]) -> None:
    """``EngineConfigError`` naming the bad value unless ``levels`` are context levels
    (``options.context_levels_problem``)."""
    problem = context_levels_problem(levels)
    if problem:
        raise EngineConfigError(problem)


def context_reserve(max_k: int) -> int:
    """Tokens a timed request holds beyond its prompt: its longest batch's output tokens plus the
    drafts of its last step (and one token of slack)."""
    return LONG_MAX_TOKENS + int(max_k) + 1


def propose_context_levels(max_model_len: int, max_k: int, *, low: int = DEFAULT_PROMPT_TOKENS, count: int = 4,
                           cap: int | None = None) -> tuple[int, ...]:
    """``count`` context levels from ``low`` up to the largest power of two a timed request fits in
    ``max_model_len`` (``context_reserve`` tokens beyond its prompt), at most ``cap``: powers of two
    spread evenly in log scale, so each context bucket (``core.table.context_buckets``) spans the
    same ratio. ``max_model_len`` 2048 and K = 3 give ``(32, 128, 256, 1024)``; 8192 with ``cap``
    4096 gives ``(32, 128, 1024, 4096)``. Fewer when the span has fewer powers of two."""
    top_len = int(max_model_len) - context_reserve(max_k)
    if cap is not None:
        top_len = min(top_len, int(cap))
    if top_len < low:
        raise EngineConfigError(f"max_model_len = {max_model_len} leaves no context level of at least {low} tokens "
                                f"(each timed request needs {context_reserve(max_k)} tokens beyond its prompt)")
    lo_exp, hi_exp = math.ceil(math.log2(low)), int(math.floor(math.log2(top_len)))
    n = max(1, min(count, hi_exp - lo_exp + 1))
    exps = sorted({lo_exp + round(i * (hi_exp - lo_exp) / (n - 1)) for i in range(n)} if n > 1 else {lo_exp})
    levels = [2 ** e for e in exps]
    levels[0] = low  # the first level is ``low`` itself (the plan's prompt_tokens), a power of two or not
    return tuple(sorted(levels))


def default_plan(config: ServerConfig, **fields: Any) -> ProfilePlan:
    """The plan for ``config``'s launch K and max_num_seqs from ``PlanFields`` keywords (``batch_sizes``,
    ``ks``, ``repetitions``, ``include_no_spec``, ``accept_batch_sizes``, ``prompt_tokens``; any
    left out takes its default), every one checked against the launch (``plan_from_options``)."""
    return plan_from_options(config, PlanFields(**fields))


def plan_from_options(config: ServerConfig, options: PlanFields) -> ProfilePlan:
    """The ``ProfilePlan`` of ``options`` (a ``ProfileOptions`` or plain ``PlanFields``) on ``config``'s
    launch: None resolved to the default its field names, values sorted without repeats, and every
    batch size and k checked against the launch K and max_num_seqs (``PlanFields.check_engine``)."""
    K = int(config.num_speculative_tokens or 0)
    if K < 1:
        raise EngineConfigError("profiling needs num_speculative_tokens >= 1")

    given = {name: getattr(options, name) for name in _names(PlanFields)}
    defaults = {"batch_sizes": batch_size_grid(config.max_num_seqs), "ks": range(K + 1)}
    for name in ("batch_sizes", "ks", "accept_batch_sizes"):  # accept None: the plan's own default
        values = given[name] if given[name] is not None else defaults.get(name)
        given[name] = None if values is None else tuple(sorted(set(values)))
    if given["accept_batch_sizes"] is None and getattr(options, "plan_search", "grid") == "adaptive" \
            and getattr(options, "mode", "one_launch") == "one_launch":
        # measured in any case: the adaptive plan starts there
        coarse = coarse_batch_sizes(given["batch_sizes"], getattr(options, "coarse_points", COARSE_POINTS))
        given["accept_batch_sizes"] = tuple(sorted({coarse[0], coarse[len(coarse) // 2], coarse[-1]}))
    plan = ProfilePlan(**given)
    plan.check_engine(config.max_num_seqs, K)
    return plan


def fixed_k_baseline_options(options: ProfileOptions, plan: ProfilePlan) -> ProfileOptions:
    """The ``fixed_k`` run that backs ``options.fixed_k_baseline``: a launch per k of
    ``options.fixed_k_ks`` (default: every k >= 1 of the plan), at four batch sizes of its grid
    (enough to show the engine-dependence trap; the full grid would cost a launch per k for little
    more), at the plan's first context level only (the check compares batch-size tables). A k of
    ``fixed_k_ks`` the plan does not time raises ``EngineConfigError``."""
    bs = plan.batch_sizes
    sparse = tuple(sorted({bs[0], bs[len(bs) // 4], bs[len(bs) // 2], bs[-1]}))
    drafting = tuple(k for k in plan.ks if k >= 1)
    ks = drafting if options.fixed_k_ks is None else tuple(sorted(set(options.fixed_k_ks)))
    if not set(ks) <= set(drafting):
        raise EngineConfigError(f"fixed_k_ks = {list(ks)!r}: {sorted(set(ks) - set(drafting))} not among the "
                                f"plan's k >= 1 {list(drafting)}")
    return dataclasses.replace(options, mode="fixed_k", batch_sizes=sparse, ks=ks, include_no_spec=False,
                               accept_batch_sizes=(), fixed_k_baseline=False, fixed_k_ks=None,
                               context_levels=plan.context_levels[:1])


def rotations(items: Sequence[T], repetitions: int) -> list[list[T]]:
    """Order per repetition, rotated so drift cancels: (k0 k1 k3), (k1 k3 k0), (k3 k0 k1), ..."""
    n = len(items)
    return [list(items[r % n:]) + list(items[: r % n]) for r in range(repetitions)]


def launch_table(ks: Iterable[int], max_num_seqs: int) -> tuple[tuple[int, int, int], ...]:
    """A launch table that lists every k of ``ks`` once: ``[[1, 1, k0], [2, 2, k1], ...,
    [n, max_num_seqs, k_last]]``.

    The profiler switches k at runtime, so which B gets which k here does not matter; what
    matters on a GPU is that every k appears, because Model Runner V2 captures full CUDA graphs
    only for the k values of the launch table (docs/engine-facts.md, "GPU (H200, vLLM 0.26)").
    """
    kk = sorted(set(int(k) for k in ks))
    if not kk:
        raise EngineConfigError("a launch table needs at least one k")
    if len(kk) > max_num_seqs:
        raise EngineConfigError(f"ks = {kk} has {len(kk)} values but max_num_seqs = {max_num_seqs}: a launch "
                                "table lists each k on its own batch size; raise max_num_seqs or time fewer k")
    rows = [(i + 1, i + 1, k) for i, k in enumerate(kk[:-1])]
    rows.append((len(kk), max_num_seqs, kk[-1]))
    return tuple(rows)


def switching_config(base: ServerConfig, ks: Iterable[int], rates: float, work_dir: str | None) -> ServerConfig:
    """A launch at the base's K whose table lists every k of ``ks`` (k switched at runtime), with
    every draft rejected (``rates`` 0) or accepted (1)."""
    K = int(base.num_speculative_tokens or 0)
    return dataclasses.replace(base, table=launch_table(ks, base.max_num_seqs),
                               synthetic_acceptance_rates=tuple([float(rates)] * K), work_dir=work_dir)


def per_k_config(base: ServerConfig, k: int, work_dir: str | None) -> ServerConfig:
    """A launch at the base's K with the one-range table ``[[1, N, k]]``, every draft rejected."""
    K = int(base.num_speculative_tokens or 0)
    return dataclasses.replace(base, table=((1, base.max_num_seqs, int(k)),),
                               synthetic_acceptance_rates=tuple([0.0] * K), work_dir=work_dir)


def fixed_k_config(base: ServerConfig, k: int, work_dir: str | None) -> ServerConfig:
    """A launch with ``num_speculative_tokens = k`` and no table (fixed k, no DSD), every draft rejected."""
    return dataclasses.replace(base, num_speculative_tokens=int(k), table=None,
                               synthetic_acceptance_rates=tuple([0.0] * int(k)), work_dir=work_dir)


def context_config(base: ServerConfig, plan: ProfilePlan) -> ServerConfig:
    """``base`` with ``max_model_len`` raised (never lowered) to hold a timed request at the plan's
    longest context level (``context_reserve`` tokens beyond its prompt)."""
    need = plan.context_levels[-1] + context_reserve(int(base.num_speculative_tokens or 0))
    return base if base.max_model_len >= need else dataclasses.replace(base, max_model_len=need)


def plan_lines(plan: ProfilePlan, options: ProfileOptions) -> list[str]:
    """What a profile with ``plan`` measures, one line per context level, without launching anything
    (``tabletune profile --dry-run``): the adaptive plan's first pass at the first level (the grid's
    coarse batch sizes) and, at each further level, the seed it takes from the level below; the grid
    plan's every batch size at every level."""
    adaptive = options.plan_search == "adaptive" and options.mode == "one_launch" and len(plan.ks) >= 2
    first = coarse_batch_sizes(plan.batch_sizes, options.coarse_points) if adaptive else list(plan.batch_sizes)
    per_level = len(dataclasses.replace(plan, batch_sizes=tuple(first)).cells(options.mode))
    out = [f"plan ({options.plan_search}, mode {options.mode}): k {list(plan.ks)}, grid B {list(plan.batch_sizes)}, "
           f"{plan.repetitions} repetitions of {plan.decode_steps} decode steps, context levels "
           f"{list(plan.context_levels)}"]
    for i, level in enumerate(plan.context_levels):
        if not adaptive:
            how = f"every B of the grid: {per_level} cells"
        elif i == 0:
            how = f"first pass B {first} ({per_level} cells), then bisection where the best k changes"
        else:
            how = (f"first pass: B {plan.batch_sizes[0]}, {plan.batch_sizes[-1]} and both sides of each boundary "
                   f"context {plan.context_levels[i - 1]} found, then bisection")
        out.append(f"  context {level}: prompts of {level} tokens; {how}")
    return out


def no_spec_config(base: ServerConfig, work_dir: str | None) -> ServerConfig:
    """The same engine without speculation (the baseline cells)."""
    return dataclasses.replace(base, method=None, drafter=None, num_speculative_tokens=None, table=None,
                               synthetic_acceptance_rates=None, speculative_extra={}, work_dir=work_dir)
