"""The documents: what is measured and what is published, each round-tripping through JSON.

Every document carries ``schema`` (its kind) and ``schema_version``; loading a document of
another kind or a newer version fails with a message that says which, and a document with a
missing or wrong field fails with a ``DocumentError`` that names it. Every number of a document has
its bounds declared once, in its class's ``BOUNDS`` (``options.Bound``; the mixed-step samples of a
profile in ``SAMPLE_BOUNDS``, a prior's workload in ``WORKLOAD_BOUNDS``), and is checked when the
document is built: by the writer that builds it, and by every reader (the store, an imported file).
The JSON round-trip and schema check every document shares is ``formats.document_base.Document``.
Numpy and stdlib only.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tabletune_pipelines.core.context_acceptance import (
    BucketAcceptance,
    buckets_from_json,
    check_breakdown,
    rates_by_context,
)
from tabletune_pipelines.core.evidence import Boundary
from tabletune_pipelines.core.goodput import validate_acceptance, validate_step_time
from tabletune_pipelines.core.noise import CellEstimate
from tabletune_pipelines.core.stepcost import GraphEnvelope, StepSample, Workload
from tabletune_pipelines.core.steptime import StepTimeSurface, lowest_context, median_standard_error, relative_spread
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import DocumentError, EmptyProfileError, InvalidStepTimeError
from tabletune_pipelines.formats.document_base import SCHEMA_VERSION, Document, digest, slug
from tabletune_pipelines.formats.prior_workload import WORKLOAD_BOUNDS, check_workload
from tabletune_pipelines.options import (
    BATCH_SIZE,
    COUNT,
    DRAFT_LENGTH,
    LAUNCH_K,
    STEP_MS,
    TOKENS,
    Bound,
    check_bounds,
    check_value,
)
from tabletune_pipelines.vocab import (
    CONTEXT_AGGREGATES,
    DEFAULT_CUDAGRAPH_MODE,
    DEFAULT_DTYPE,
    DEFAULT_MODEL_RUNNER,
    DEFAULT_PROFILE_MODE,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_TEMPERATURE,
    DRAFT_VERDICTS,
    MAX_STEP_MS,
    PRIOR_SOURCES,
    PROFILE_MODES,
    SEARCH_RULES,
    TIMING_SOURCES,
    ContextAggregate,
    DraftVerdict,
    Method,
    ModelRunner,
    PriorSource,
    ProfileMode,
    SearchRule,
    TimingSource,
)

__all__ = ["PROFILE_MODES", "WORKLOAD_BOUNDS", "AcceptancePrior", "DraftLengthTable", "EngineIdentity",
           "StepTimeCell", "StepTimeProfile"]


@dataclass(frozen=True)
class EngineIdentity(Document):
    """Everything that changes step times: a profile is valid for exactly one identity."""

    SCHEMA: ClassVar[str] = "tabletune.engine_identity"

    gpu: str
    """Accelerator name as reported by the engine (``"cpu"`` on the embedded default)."""
    vllm_version: str
    """vLLM version string, e.g. ``"0.32.0+cpu"``."""
    model: str
    """Target model (hub name or local path)."""
    drafter: str | None
    """Draft model (hub name or local path); None for n-gram drafting."""
    method: Method
    """Speculative method (``vocab.Method``): ``draft_model``, ``ngram``, ``eagle``, ``eagle3``, ..."""
    max_k: int
    """Launch ``num_speculative_tokens``: the largest k any table may use."""
    max_num_seqs: int
    """Largest batch size the engine schedules; tables cover 1..max_num_seqs."""
    dtype: str = DEFAULT_DTYPE
    """Model dtype."""
    cudagraph_mode: str = DEFAULT_CUDAGRAPH_MODE
    """CUDA-graph mode of the serving path (``"none"`` when eager, e.g. on CPU)."""
    model_runner: ModelRunner = DEFAULT_MODEL_RUNNER
    """vLLM model runner of the launches (``"auto"``: vLLM's choice; ``"v1"``/``"v2"`` forced). V1 forces
    piecewise CUDA graphs once any table is set: 3-4x slower small-batch steps than V2 on an H200."""
    capture_ceiling: int | None = None
    """Largest CUDA-graph capture size in tokens the engine runs with (the graph envelope: a served
    step above it runs without graphs). None: no graphs (eager, the CPU build), or an identity
    recorded before the envelope was (it keeps its key)."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step, when set explicitly; None = vLLM's default."""

    def graph_envelope(self) -> GraphEnvelope:
        """The envelope served steps run in (``core.stepcost``)."""
        return GraphEnvelope(cudagraph_mode=self.cudagraph_mode,
                             capture_ceiling=self.capture_ceiling if self.cudagraph_mode != "none" else None,
                             max_num_batched_tokens=self.max_num_batched_tokens)

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "max_k": LAUNCH_K, "max_num_seqs": BATCH_SIZE,
        "capture_ceiling": Bound(1, 1_000_000, integer=True, optional=True, why="tokens of a CUDA-graph capture"),
        "max_num_batched_tokens": Bound(1, 10_000_000, integer=True, optional=True, why="tokens per step"),
    }

    def __post_init__(self) -> None:
        check_bounds(self, where="engine identity", error=DocumentError)
        for name in ("gpu", "vllm_version", "model", "method"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise DocumentError(f"engine identity field {name!r} must be a non-empty string")

    @property
    def key(self) -> str:
        """Readable, stable partition key: ``gpu__vllm__model__drafter__method__kK__nN__hash``."""
        parts = [
            slug(self.gpu), "vllm-" + slug(self.vllm_version), slug(self.model),
            slug(self.drafter or "none"), slug(self.method), f"k{self.max_k}", f"n{self.max_num_seqs}",
        ]
        fields = dataclasses.asdict(self)
        if fields["model_runner"] == DEFAULT_MODEL_RUNNER:
            # Added after the first stores were written: leaving the default out keeps their keys.
            del fields["model_runner"]
        for name in ("capture_ceiling", "max_num_batched_tokens"):  # likewise (the graph envelope)
            if fields[name] is None:
                del fields[name]
        return "__".join(parts) + "__" + digest(fields, 8)


@dataclass(frozen=True)
class StepTimeCell:
    """One measured cell T(B, k): the median of repetitions and their spread."""

    k: int | None
    """Draft length; None is the no-speculation baseline server."""
    batch_size: int
    """Requests in the decode step."""
    median_ms: float
    """Median step time over repetitions, milliseconds."""
    repetitions_ms: tuple[float, ...]
    """Each repetition's step time, milliseconds."""
    acceptance: DraftVerdict = "reject"
    """``"reject"``: every draft rejected (synthetic 0); ``"accept"``: every draft accepted."""
    launch_k: int | None = None
    """``num_speculative_tokens`` of the launch the cell was timed under."""
    timing: TimingSource = "engine"
    """``"engine"`` (intervals between scheduler updates) or ``"wall"`` ((t65 - t1)/64)."""
    stderr_ms: float | None = None
    """Standard error of ``median_ms`` from the repetitions, ms (``core.steptime.median_standard_error``;
    None with fewer than two); computed when not given (cells stored before the field existed)."""
    context_tokens: int = DEFAULT_PROMPT_TOKENS
    """The context level: tokens of each timed prompt, so the KV length its steps are timed at."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "k": dataclasses.replace(DRAFT_LENGTH, optional=True, why="drafts per request; null: no speculation"),
        "batch_size": BATCH_SIZE,
        "stderr_ms": Bound(0.0, MAX_STEP_MS, optional=True, why="milliseconds; null: fewer than two repetitions"),
        "launch_k": dataclasses.replace(DRAFT_LENGTH, optional=True, why="the launch's K; null: not recorded"),
        "context_tokens": dataclasses.replace(TOKENS, low=1, why="a context level: tokens of each timed prompt"),
    }

    def __post_init__(self) -> None:
        where = f" at B={self.batch_size}, k={self.k}"
        validate_step_time(self.median_ms, where=f" (median_ms){where}")
        # Every repetition is a step time too: the noise model, the re-measurement and the spread
        # use them, so one NaN, negative or absurd repetition would change the table silently.
        if isinstance(self.repetitions_ms, (str, bytes, Mapping)) or not hasattr(self.repetitions_ms, "__iter__"):
            raise DocumentError(f"step-time cell{where}: repetitions_ms = {self.repetitions_ms!r:.60} must be a "
                                "list of step times")
        for i, r in enumerate(self.repetitions_ms):
            if isinstance(r, bool) or not isinstance(r, numbers.Real):
                raise InvalidStepTimeError(f"step time {r!r:.40} (repetitions_ms[{i}]){where} is not a number")
            validate_step_time(r, where=f" (repetitions_ms[{i}]){where}")
        for i, r in enumerate((self.median_ms, *self.repetitions_ms)):  # the floor validate_step_time leaves open
            check_value(STEP_MS, "median_ms" if i == 0 else f"repetitions_ms[{i - 1}]", r,
                        where=f"step-time cell{where}", error=InvalidStepTimeError)
        if self.stderr_ms is None and len(self.repetitions_ms) >= 2:
            object.__setattr__(self, "stderr_ms", median_standard_error(self.repetitions_ms))
        check_bounds(self, where="step-time cell", error=DocumentError)
        if self.acceptance not in DRAFT_VERDICTS:
            raise DocumentError(f"step-time cell: acceptance = {self.acceptance!r} must be one of {DRAFT_VERDICTS}")
        if self.timing not in TIMING_SOURCES:
            raise DocumentError(f"step-time cell: timing = {self.timing!r} must be one of {TIMING_SOURCES}")

    @property
    def spread(self) -> float:
        """(max - min) / median of the repetitions."""
        return relative_spread(self.repetitions_ms) if self.repetitions_ms else 0.0

    @property
    def estimate(self) -> CellEstimate:
        """The cell as the noise model sees it (median, repetitions, standard error)."""
        return CellEstimate(self.median_ms, len(self.repetitions_ms), self.stderr_ms, tuple(self.repetitions_ms))


@dataclass(frozen=True)
class StepTimeProfile(Document):
    """All cells measured for one engine identity."""

    SCHEMA: ClassVar[str] = "tabletune.step_time_profile"

    identity: EngineIdentity
    """The engine the cells were measured on."""
    cells: tuple[StepTimeCell, ...]
    """Measured cells (spec k ≥ 0, the no-spec baseline, all-accepted cells)."""
    mode: ProfileMode = DEFAULT_PROFILE_MODE
    """How the cells were launched (``vocab.ProfileMode``)."""
    samples: tuple[StepSample, ...] = ()
    """Steps timed with prefill in them (mixed steps, ``engine.mixed``) and around them: what the
    served step-cost fit (``core.stepcost.fit_prefill_costs``) rests on. Empty: decode cells only."""

    def __post_init__(self) -> None:
        if self.mode not in PROFILE_MODES:
            raise DocumentError(f"step-time profile: mode = {self.mode!r} must be one of {PROFILE_MODES}")
        object.__setattr__(self, "samples", check_samples(self.samples, where="step-time profile"))
        ident = self.identity
        for i, sample in enumerate(self.samples):  # within the engine that measured them
            if sample.k > ident.max_k or sample.batch > ident.max_num_seqs:
                name, value, limit, what = (("k", sample.k, ident.max_k, "K (max_k)") if sample.k > ident.max_k
                                            else ("batch", sample.batch, ident.max_num_seqs, "max_num_seqs"))
                raise DocumentError(f"step-time profile of {ident.key}, samples[{i}]: {name} = {value} is above the "
                                    f"identity's {what} = {limit}; that engine cannot have run such a step")

    def reject_cells(self) -> dict[int, dict[int, float]]:
        out: dict[int, dict[int, float]] = {}
        for c in lowest_context(self.cells):
            if c.k is not None and c.acceptance == "reject":
                out.setdefault(c.k, {})[c.batch_size] = c.median_ms
        return out

    def accept_cells(self) -> dict[int, dict[int, float]]:
        out: dict[int, dict[int, float]] = {}
        for c in lowest_context(self.cells):
            if c.k is not None and c.acceptance == "accept":
                out.setdefault(c.k, {})[c.batch_size] = c.median_ms
        return out

    def no_spec_ms(self) -> dict[int, float]:
        return {c.batch_size: c.median_ms for c in lowest_context(self.cells) if c.k is None}

    def estimates(self, acceptance: DraftVerdict = "reject") -> dict[int, dict[int, CellEstimate]]:
        """``{k: {B: CellEstimate}}`` of the speculative cells of one acceptance mode."""
        out: dict[int, dict[int, CellEstimate]] = {}
        for c in lowest_context(self.cells):
            if c.k is not None and c.acceptance == acceptance:
                out.setdefault(c.k, {})[c.batch_size] = c.estimate
        return out

    @property
    def has_error_estimates(self) -> bool:
        """Whether some speculative cell has two repetitions to compare (a standard error)."""
        return any(c.stderr_ms is not None for c in self.cells if c.k is not None)

    def wall_timed(self) -> list[StepTimeCell]:
        """Cells with at least one repetition timed by the client's wall clock, not the engine."""
        return [c for c in self.cells if c.timing == "wall"]

    def remeasured(self) -> list[StepTimeCell]:
        """Speculative all-rejected cells with more repetitions than the profile's first pass gave
        every cell (the adaptive re-measurement added them)."""
        reject = [c for c in lowest_context(self.cells) if c.k is not None and c.acceptance == "reject"]
        if not reject:
            return []
        base = min(len(c.repetitions_ms) for c in reject)
        return [c for c in reject if len(c.repetitions_ms) > base]

    def surface(self) -> StepTimeSurface:
        """T(B, k) with every draft rejected, for the table search."""
        cells = self.reject_cells()
        if not cells:
            raise EmptyProfileError(f"profile of {self.identity.key} has no speculative cells")
        return StepTimeSurface.from_cells(cells)

    @classmethod
    def _from_body(cls, body: dict[str, Any]) -> StepTimeProfile:
        ident = body.pop("identity")
        ident = EngineIdentity.from_dict(ident if "schema" in ident else
                                         {"schema": EngineIdentity.SCHEMA, "schema_version": SCHEMA_VERSION, **ident})
        cells = []
        for i, c in enumerate(body.pop("cells")):
            try:
                cells.append(StepTimeCell(**{**c, "repetitions_ms": tuple(c["repetitions_ms"])}))
            except InvalidStepTimeError as exc:  # name the profile, so the cell can be found
                raise InvalidStepTimeError(f"step-time profile of {ident.key}, cells[{i}]: {exc}") from None
        raw = body.pop("samples", ())
        if not isinstance(raw, list | tuple):
            raise DocumentError(f"step-time profile of {ident.key}: samples must be a list of mixed-step samples")
        samples = tuple(sample_from_dict(x, where=f"step-time profile of {ident.key}, samples[{i}]")
                        for i, x in enumerate(raw))
        return cls(identity=ident, cells=tuple(cells), samples=samples, **body)


SAMPLE_BOUNDS: dict[str, Bound] = {
    "batch": BATCH_SIZE, "k": DRAFT_LENGTH, "decode_tokens": dataclasses.replace(TOKENS, low=1),
    "prefill_tokens": TOKENS, "ms": STEP_MS,
}
"""The bounds of a mixed-step sample's numbers (``core.stepcost.StepSample``, a record of ``core``):
the one rule of the profiler's store writer, the store's reader and an imported profile."""


def check_sample(sample: StepSample, *, where: str) -> StepSample:
    """``sample`` when every number is within ``SAMPLE_BOUNDS`` and its decode tokens are at least
    its batch (every request decodes its own token), else ``InvalidStepTimeError`` (its time) or
    ``DocumentError`` naming ``where`` and the field."""
    for name, bound in SAMPLE_BOUNDS.items():
        check_value(bound, name, getattr(sample, name), where=where,
                    error=InvalidStepTimeError if name == "ms" else DocumentError)
    if sample.decode_tokens < sample.batch:
        raise DocumentError(f"{where}: decode_tokens = {sample.decode_tokens} < batch = {sample.batch}; every "
                            "decoding request carries its own token")
    return sample


def check_samples(samples: Any, *, where: str) -> tuple[StepSample, ...]:
    """Every sample of a profile through ``check_sample`` (``where``: whose), as a tuple."""
    if isinstance(samples, (str, bytes, Mapping)) or not hasattr(samples, "__iter__"):
        raise DocumentError(f"{where}: samples must be a list of mixed-step samples")
    out = tuple(samples)
    for i, sample in enumerate(out):
        if not isinstance(sample, StepSample):
            raise DocumentError(f"{where}: samples[{i}] = {sample!r:.60} is not a mixed-step sample")
        check_sample(sample, where=f"{where}, samples[{i}]")
    return out


def sample_from_dict(data: Any, *, where: str) -> StepSample:
    """A mixed-step sample from its JSON object (its five fields, no other), checked by ``check_sample``."""
    names = tuple(SAMPLE_BOUNDS)
    if not isinstance(data, Mapping) or set(data) != set(names):
        got = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise DocumentError(f"{where}: a mixed-step sample has exactly the fields {list(names)}, got {got}")
    for name in names:  # before the record is built: it holds what it is given
        check_value(SAMPLE_BOUNDS[name], name, data[name], where=where,
                    error=InvalidStepTimeError if name == "ms" else DocumentError)
    return check_sample(StepSample(**{n: data[n] for n in names}), where=where)


@dataclass(frozen=True)
class AcceptancePrior(Document):
    """Per-position survival a_1..a_K measured on a prompt set. Stores the prompt set's
    fingerprint and size, never the prompts."""

    SCHEMA: ClassVar[str] = "tabletune.acceptance_prior"

    rates: tuple[float, ...]
    """a_i = probability that the first i drafts are all accepted."""
    num_drafts: int
    """Request-steps that drafted (denominator of a_1)."""
    drafted_per_pos: tuple[int, ...]
    """How often position i was drafted."""
    accepted_per_pos: tuple[int, ...]
    """How often position i was kept."""
    prompt_fingerprint: str
    """HMAC-SHA256 of the sampled prompts, keyed per installation (engine/acceptance.py): identifies the
    set, cannot reproduce it, and cannot confirm a guessed set without the key."""
    prompt_count: int
    """Number of prompts the measurement ran."""
    temperature: float = DEFAULT_TEMPERATURE
    """Sampling temperature used (same as serving)."""
    source: PriorSource = "measured"
    """``measured`` (offline run), ``synthetic`` (known rates), or ``live`` (controller counters)."""
    week: str | None = None
    """ISO week start date of the logged prompts, for weekly priors."""
    deployment: str | None = None
    """Deployment whose logged prompts were measured."""
    workload: dict[str, Any] | None = None
    """What the measured requests brought (``core.stepcost.Workload``: mean ``prompt_tokens`` and
    ``output_tokens``, and their ``source`` in words): it sets the prefill a served step carries.
    None: not recorded (a prior stored before it was, or a synthetic one)."""
    context: tuple[BucketAcceptance, ...] | None = None
    """Per context bucket, its sample and rates, pooled where the sample is too small
    (``core.context_acceptance``; ``rates_by_context`` reads it); None: one bucket."""

    def rates_by_context(self, levels: tuple[int, ...] = ()) -> dict[int, tuple[float, ...]]:
        """Context level → the rates its bucket serves (``core.context_acceptance.rates_by_context``)."""
        return rates_by_context(self.context, self.rates, levels)

    def to_dict(self) -> dict[str, Any]:  # one bucket: the document (and its id) as without the field
        return {k: v for k, v in super().to_dict().items() if k != "context" or v is not None}

    def workload_model(self) -> Workload | None:
        """``workload`` as the step-cost model's ``Workload`` (None when not recorded)."""
        return None if self.workload is None else Workload.from_dict(self.workload)

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "num_drafts": COUNT, "drafted_per_pos": COUNT, "accepted_per_pos": COUNT,
        "prompt_count": Bound(0, 10_000_000, integer=True, why="prompts measured"),
        "temperature": Bound(0.0, 10.0, why="a sampling temperature; above 10 sampling is uniform noise"),
    }

    def __post_init__(self) -> None:
        validate_acceptance(self.rates, name="acceptance prior")
        for name in ("drafted_per_pos", "accepted_per_pos"):
            if isinstance(getattr(self, name), (str, bytes, Mapping)) or not hasattr(getattr(self, name), "__len__"):
                raise DocumentError(f"acceptance prior: {name} must be a list of counts")
        check_bounds(self, where="acceptance prior", error=DocumentError)
        if self.workload is not None:
            check_workload(self.workload, where="acceptance prior: workload")
        if len(self.drafted_per_pos) != len(self.rates) or len(self.accepted_per_pos) != len(self.rates):
            raise DocumentError(
                f"acceptance prior: drafted_per_pos ({len(self.drafted_per_pos)}), accepted_per_pos "
                f"({len(self.accepted_per_pos)}) and rates ({len(self.rates)}) must have the same length")
        if self.source not in PRIOR_SOURCES:
            raise DocumentError(f"acceptance prior: source = {self.source!r} must be one of {PRIOR_SOURCES}")
        if self.context is not None:
            check_breakdown(self.context, len(self.rates), self.prompt_count, self.num_drafts, error=DocumentError)

    @property
    def max_k(self) -> int:
        return len(self.rates)

    @property
    def prior_id(self) -> str:
        body = self.to_dict()
        if body.get("workload") is None:  # added later: leaving it out keeps stored priors' ids
            body.pop("workload", None)
        return f"prior-{body.get('week') or 'adhoc'}-{digest(body, 10)}"

    @classmethod
    def _from_body(cls, body: dict[str, Any]) -> AcceptancePrior:
        for name in ("rates", "drafted_per_pos", "accepted_per_pos"):
            body[name] = tuple(body[name])
        if body.get("context") is not None:
            body["context"] = buckets_from_json(body["context"], error=DocumentError)
        return cls(**body)


@dataclass(frozen=True)
class DraftLengthTable(Document):
    """A tuned ``num_speculative_tokens_per_batch_size`` with its provenance."""

    SCHEMA: ClassVar[str] = "tabletune.draft_length_table"

    ranges: tuple[tuple[int, int, int], ...]
    """vLLM's inclusive ranges ``[[start, end, k], ...]`` covering 1..max_num_seqs."""
    max_num_seqs: int
    """Batch sizes covered."""
    max_k: int
    """Launch ``num_speculative_tokens`` the table is meant for."""
    identity_key: str
    """Engine identity whose step-time profile produced the table."""
    prior_id: str
    """Acceptance prior that produced the table."""
    acceptance_rates: tuple[float, ...] = ()
    """The prior's a_i, kept so a controller can start from them."""
    predicted_worst_loss: float = 0.0
    """Predicted worst loss over B against the best fixed k at that B."""
    step_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """The decode surface T(B, k) the table was derived from, ``{k: {B: ms}}`` (string keys for
    JSON); when the search priced served steps, the expected extra per step is in ``served_cost``."""
    search_policy: SearchRule = "stickiness"
    """The search's rule (``vocab.SearchRule``); tables stored before the evidence rule: ``stickiness``."""
    confidence: float | None = None
    """Confidence level of the bounds below (None: a table stored before they were computed)."""
    has_error_estimates: bool = False
    """Whether the profile's cells had error estimates (False: the bounds equal the point estimates)."""
    predicted_worst_loss_lcb: float | None = None
    """Lower confidence bound of ``predicted_worst_loss``."""
    predicted_worst_loss_ucb: float | None = None
    """Upper confidence bound of ``predicted_worst_loss``."""
    boundaries: tuple[Boundary, ...] = ()
    """Every boundary of ``ranges`` with its goodput gain, lower bound and confidence."""
    within_noise: dict[str, list[int]] = field(default_factory=dict)
    """Per batch size (string key), the k values that could be as good as the chosen one."""
    cells_remeasured: int = 0
    """Profile cells that the adaptive re-measurement gave more repetitions."""
    wall_timed_cells: int = 0
    """Profile cells with a repetition timed by the client's wall clock (engine timing failed)."""
    accepted_work_fit: dict[str, Any] = field(default_factory=dict)
    """The accepted-work correction's fit and its error (``core.noise.AcceptedWorkFit.summary``;
    empty: the profile has no all-accepted cells or the correction was off)."""
    served_cost: dict[str, Any] = field(default_factory=dict)
    """What served steps were priced at (``tuning.derive``): the workload, the graph envelope, the
    prefill fits with their errors, the expected extra per step at a few B, and the cells whose
    served steps no fit covers. Empty: the table was derived from decode steps alone."""
    context_entries: tuple[tuple[int, ...], ...] = ()
    """The full (B, ctx) table as vLLM's 5-item entries ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]`` when k
    depends on the context (two or more buckets); empty: one bucket, and ``ranges`` is the whole table.
    ``ranges`` is then the base (first, shortest) context level's batch-only table."""
    ctx_agg: ContextAggregate = "mean"
    """How a step's context is aggregated over its running requests (``vocab.ContextAggregate``);
    read only with ``context_entries``."""
    context_columns: tuple[dict[str, Any], ...] = ()
    """With ``context_entries``: per context bucket, the step times and rates the controller corrects
    it from (``formats.context_columns.ContextColumn.to_dict``); empty with one bucket."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "max_num_seqs": BATCH_SIZE, "max_k": LAUNCH_K,
        "acceptance_rates": Bound(0.0, 1.0, why="an acceptance rate"),
        "predicted_worst_loss": Bound(-1e3, 1e3, why="a fraction of goodput"),
        "confidence": Bound(0.5, 1.0, high_open=True, optional=True, why="a confidence level"),
        "predicted_worst_loss_lcb": Bound(-1e3, 1e3, optional=True, why="a fraction of goodput"),
        "predicted_worst_loss_ucb": Bound(-1e3, 1e3, optional=True, why="a fraction of goodput"),
        "cells_remeasured": COUNT, "wall_timed_cells": COUNT,
    }

    def __post_init__(self) -> None:
        check_bounds(self, where="draft-length table", error=DocumentError)
        DraftTable.from_entries([list(r) for r in self.ranges], max_num_seqs=self.max_num_seqs, max_k=self.max_k)
        if self.search_policy not in SEARCH_RULES:
            raise DocumentError(f"draft-length table: search_policy = {self.search_policy!r} must be one of "
                                f"{SEARCH_RULES}")
        if self.ctx_agg not in CONTEXT_AGGREGATES:
            raise DocumentError(f"draft-length table: ctx_agg = {self.ctx_agg!r} must be one of {CONTEXT_AGGREGATES}")
        if self.context_entries and self.full_table.axes.context is None:
            raise DocumentError(f"draft-length table: context_entries {[list(e) for e in self.context_entries]!r:.120} "
                                "must be 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, k] entries")

    @property
    def draft(self) -> DraftTable:
        """``ranges`` as the table type (validated by the publish gate's rules)."""
        return DraftTable.from_entries([list(r) for r in self.ranges], max_num_seqs=self.max_num_seqs,
                                       max_k=self.max_k)

    @property
    def full_table(self) -> DraftTable:
        """The full (B, ctx) table: ``context_entries`` (validated as ``draft``) with a context axis, else ``draft``."""
        if not self.context_entries:
            return self.draft
        return DraftTable.from_entries([list(e) for e in self.context_entries], max_num_seqs=self.max_num_seqs,
                                       max_k=self.max_k, allow_context=True)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        if not self.context_entries:  # a table with one bucket is written as it was before the context axis
            del body["context_entries"], body["ctx_agg"]
        if not self.context_columns:  # written only where there are columns: older tables keep their ids
            body.pop("context_columns")
        return body

    @property
    def evidence_supported(self) -> bool:
        """Every boundary's gain has a lower confidence bound above the threshold."""
        return all(b.supported for b in self.boundaries)

    def published_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The document split for the published file: the table fields every reader knows, and the
        evidence fields (policy, bounds, boundaries, k within noise, re-measured and wall-timed cells)."""
        body = self.to_dict()
        evidence = {k: body.pop(k) for k in list(body) if k not in PUBLISHED_TABLE_FIELDS}
        evidence["ranges"] = len(self.ranges)
        return body, evidence

    def as_vllm(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]

    def speculative_config(self, base: Mapping[str, Any] | None = None, *, context_schedule: bool = False
                           ) -> dict[str, Any]:
        """The ``--speculative-config`` JSON for a deployment without the controller. With
        ``context_schedule`` (the engine's vLLM accepts 5-item entries: ``engine.installed``) and
        ``context_entries``, the (B, ctx) table under ``speculative_token_schedule`` with its ``ctx_agg``;
        else the batch-only ``ranges`` under ``num_speculative_tokens_per_batch_size``."""
        cfg = dict(base or {})
        cfg["num_speculative_tokens"] = self.max_k
        if context_schedule and self.context_entries:
            cfg["speculative_token_schedule"] = [list(e) for e in self.context_entries]
            cfg["ctx_agg"] = self.ctx_agg
        else:
            cfg["num_speculative_tokens_per_batch_size"] = self.as_vllm()
        return cfg

    @property
    def table_id(self) -> str:
        body = self.to_dict()
        if not body.get("served_cost"):  # added later: leaving it out keeps stored tables' ids
            body.pop("served_cost", None)
        return "table-" + digest(body, 12)

    @classmethod
    def _from_body(cls, body: dict[str, Any]) -> DraftLengthTable:
        body["ranges"] = tuple(tuple(int(x) for x in r) for r in body["ranges"])
        rates = body.get("acceptance_rates", ())
        if not isinstance(rates, list | tuple):
            raise DocumentError(f"draft-length table: acceptance_rates = {rates!r:.60} must be a list of rates")
        body["acceptance_rates"] = tuple(rates)
        body["boundaries"] = tuple(Boundary(**b) for b in body.get("boundaries", ()))
        body["context_entries"] = tuple(tuple(int(x) for x in e) for e in body.get("context_entries", ()))
        body["context_columns"] = tuple(dict(c) for c in body.get("context_columns", ()))
        return cls(**body)


PUBLISHED_TABLE_FIELDS = ("schema", "schema_version", "ranges", "max_num_seqs", "max_k", "identity_key", "prior_id",
                          "acceptance_rates", "predicted_worst_loss", "step_ms", "context_entries", "ctx_agg",
                          "context_columns")
"""DraftLengthTable fields that go to the published file's ``table``; the others go to ``evidence``."""
