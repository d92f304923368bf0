"""The fleet file: which vLLM deployments TableTune tunes, and where their data lives.

The schema is declared once, below, as pydantic models (``Fleet``, ``Deployment``,
``K8sPlacement``): every field's type, bounds, default and description is there, and
``fleet_json_schema()`` prints it as JSON Schema. Unknown keys anywhere, a missing required key,
a value of the wrong type or outside its bounds are errors that name the file, the deployment and
the key (one line per problem). Values are not coerced: ``max_k: "3"`` or ``max_num_seqs: true``
is an error, not a 3 or a 1. ``${VAR}`` and ``${VAR:-default}`` are expanded in ``endpoint``,
``model``, ``drafter`` and the paths (``TABLETUNE_HOME`` defaults to ``~/.tabletune``); an unset
variable without a default is an error. Relative paths are resolved against the file's folder. A
path must not climb out of what it names: a variable whose value or default holds ``..``
(``${WHO:-../..}``), or a path written under ``${TABLETUNE_HOME}`` that resolves outside the home
folder, is an error naming the key.

The YAML itself is read strictly too: a key written twice in one mapping, an alias (``*name``) or
a merge key (``<<``), an integer of more than 32 digits, a file over ``MAX_FLEET_BYTES``, one that is
not UTF-8 or a path that is not a regular file (a named pipe: ``strict_io``) is an error naming
the file and line (YAML would keep the last duplicate silently and expand aliases without bound).
Beyond types, values must make sense: names and vLLM option values are plain tokens that cannot
be read as options, ``speculative_config`` may not set what the loader checks, ``controller`` is
checked against the controller's settings, and two deployments (or the store, or the fleet file
itself) never share a file TableTune writes.

Example (the embedded default, ``tabletune_pipelines/data/fleet.yaml``, package data, so an installed
package finds it without a checkout; ``fleet.yaml`` at the repository root is the same file, the one
users copy; ``TABLETUNE_FLEET`` points at another file; ``deploy/k8s/fleet.example.yaml`` shows a GPU
fleet)::

    schema_version: 1
    deployments:
      - name: local-cpu
        endpoint: embedded
        gpu: cpu
        model: tiny:small
        drafter: null
        method: ngram
        max_k: 3
        max_num_seqs: 16
        logged_prompts: ${TABLETUNE_HOME}/prompts/local-cpu
        published_table: ${TABLETUNE_HOME}/published/local-cpu.json

Stdlib, pyyaml and pydantic only (no Dagster): the tuner CLI loads it on machines without Dagster.

This module holds the schema (the models and their validators), the paths' variable expansion and
the loader; the strict YAML reading is ``formats.fleet_yaml``, the checks of single values
``formats.fleet_checks``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict, JsonValue

from tabletune_pipelines.errors import FleetError, LiveCountersError, SettingsError
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.formats.fleet_checks import (
    check_context_levels,
    check_name,
    check_token,
    json_value,
    one_line,
    problem,
)
from tabletune_pipelines.formats.fleet_yaml import read_fleet_yaml
from tabletune_pipelines.formats.published_files import speculative_config_path as _companion_of
from tabletune_pipelines.options import BATCH_SIZE
from tabletune_pipelines.vocab import (
    DEFAULT_MODEL_RUNNER,
    DEFAULT_SAMPLE_SIZE,
    DEFAULT_TEMPERATURE,
    STORE_FILENAME,
    VLLM_CUDAGRAPH_MODES,
    VLLM_DTYPES,
    Method,
    ModelRunner,
)

__all__ = [
    "DEFAULT_FLEET_PATH", "EMBEDDED", "FLEET_SCHEMA_VERSION", "Deployment", "Fleet", "FleetError", "K8sPlacement",
    "default_store_path", "fleet_json_schema", "load_fleet", "parse_fleet", "tabletune_home",
]

FLEET_SCHEMA_VERSION = 1
EMBEDDED = "embedded"
#: The embedded default fleet, shipped in the package (``data/fleet.yaml``), used when neither a path nor
#: TABLETUNE_FLEET is given; the same file in a checkout and in an installed package.
DEFAULT_FLEET_PATH = Path(str(files("tabletune_pipelines") / "data" / "fleet.yaml"))
#: Upper bounds of values that have the right type but could not be meant (an acceptance run of
#: 10^6 prompts, a temperature at which sampling is uniform noise).
MAX_PROMPTS = 100_000
MAX_TEMPERATURE = 10.0
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_URL_RE = re.compile(r"https?://[^/\s]+\S*")
#: ``--speculative-config`` keys the deployment's own fields own: ``speculative_config`` may not
#: set them (it would silently override what the loader checked, or the table TableTune derives).
RESERVED_SPECULATIVE_KEYS = {
    "method": "method", "model": "drafter", "num_speculative_tokens": "max_k",
    "num_speculative_tokens_per_batch_size": None,
}
#: ``controller`` keys the deployment's own fields own (what is exported is what is ingested).
RESERVED_CONTROLLER_KEYS = {"export_path": "live_counters"}


def tabletune_home() -> Path:
    """``$TABLETUNE_HOME`` or ``~/.tabletune``: where the embedded default keeps its data."""
    return Path(os.environ.get("TABLETUNE_HOME") or "~/.tabletune").expanduser()


def default_store_path() -> Path:
    """The DuckDB store: ``$TABLETUNE_DUCKDB``, else ``$TABLETUNE_HOME/tabletune_store.duckdb``."""
    return Path(os.environ.get("TABLETUNE_DUCKDB") or tabletune_home() / STORE_FILENAME).expanduser()


# -- value checks shared by the models -----------------------------------------------------------

def _expand(value: str, key: str | None, subs: list[tuple[str, str]] | None = None) -> str:
    """``${VAR}`` / ``${VAR:-default}`` from the environment; an unset VAR is named. ``subs``: gets
    each ``(written, what it became)``."""
    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if os.environ.get(name):
            text = os.environ[name]
        elif name == "TABLETUNE_HOME":
            text = str(tabletune_home())
        elif default is not None:
            text = default
        else:
            raise problem(f"{key!r} uses ${{{name}}}, which is not set (set it or write ${{{name}:-default}})")
        if subs is not None:
            subs.append((m.group(0), text))
        return text

    return _VAR_RE.sub(repl, value)


def _check_climb(value: str, expanded: str, subs: list[tuple[str, str]], key: str | None) -> None:
    """A path whose variables climb out of where it is written is flagged: a substitution with a
    ``..`` in it (``${WHO:-../..}``), or a path written under ``${TABLETUNE_HOME}`` that ends up
    outside the home folder. TableTune writes these paths; one that leaves the folder it names is a
    mistake (or a trap), not a place."""
    for written, text in subs:
        if ".." in Path(text).parts:
            raise problem(f"{key!r} = {value!r}: {written} expands to {text!r}, which climbs folders ('..'); a path "
                           f"from a variable must not leave the folder it is written in (resolved: {expanded!r})")
    if value.startswith("${TABLETUNE_HOME}"):
        home = os.path.normpath(os.path.abspath(tabletune_home()))
        target = os.path.normpath(os.path.abspath(Path(expanded).expanduser()))
        if os.path.commonpath([home, target]) != home:
            raise problem(f"{key!r} = {value!r} leaves the TableTune home folder {home} (it resolves to {target}); "
                           "write a path inside it, or an absolute path")


def _path(value: Any, info: ValidationInfo) -> Any:
    if not isinstance(value, str):
        return value  # the field's own type check names it
    one_line(value, info.field_name)
    subs: list[tuple[str, str]] = []
    expanded = _expand(value, info.field_name, subs)
    _check_climb(value, expanded, subs, info.field_name)
    p = Path(expanded).expanduser()
    base = (info.context or {}).get("base_dir") or Path.cwd()
    return p if p.is_absolute() else Path(base) / p



def _keys_other_than(reserved: Iterable[str]) -> JsonDict:
    """The JSON schema of a mapping none of whose keys is in ``reserved``."""
    words: list[JsonValue] = [*sorted(reserved)]
    return {"propertyNames": {"not": {"enum": words}}}

class _Schema(BaseModel):
    # strict: YAML's 3 vs "3" vs true are different things; frozen: a loaded fleet is a value.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class K8sPlacement(_Schema):
    """Kubernetes placement of a deployment's runs (read by orchestration/tags.py; deploy/k8s/README.md)."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Pod node selector, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}.")
    gpu_resource: str | None = Field(
        default="nvidia.com/gpu", description="Extended resource a run pod asks for (null on CPU nodes).")
    gpu_count: int = Field(default=1, ge=0, le=64, description="How many of gpu_resource each run pod gets.")
    tolerations: tuple[dict[str, Any], ...] = Field(
        default=(), strict=False, description="Kubernetes toleration objects of the run pods.")
    image: str | None = Field(default=None, description="Image carrying the deployment's vLLM version.")
    service_account: str | None = Field(default=None, description="Service account of the run pods.")
    resources: dict[str, str] = Field(
        default_factory=dict, description="Extra container resource limits and requests (cpu, memory).")

    @field_validator("resources", mode="before")
    @classmethod
    def _quantities_as_text(cls, v: Any) -> Any:
        # Kubernetes quantities: YAML reads `cpu: 8` as a number; the pod spec wants text.
        if isinstance(v, dict):
            return {k: str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for k, x in v.items()}
        return v


class Deployment(_Schema):
    """One vLLM deployment of the fleet."""

    name: str = Field(description="Unique name: letters, digits, '.', '_' and '-'.")
    endpoint: str = Field(description='"embedded" (the vLLM installed here) or the http(s) base URL of a vLLM '
                                      "server, whose GET /version gives the engine version.")
    gpu: str = Field(description='Accelerator type ("cpu", "H100", "A10G", ...): part of the engine identity.')
    model: str = Field(description='Target model: hub name, path, or "tiny:<size>" for the project\'s tiny models.')
    drafter: str | None = Field(description="Draft model; null for n-gram drafting (and only then).")
    method: Method = Field(description="vLLM speculative method (speculative_config.method).")
    max_k: int = Field(ge=1, le=16, description="Launch num_speculative_tokens: the largest k any table may use.")
    max_num_seqs: int = Field(ge=BATCH_SIZE.low, le=BATCH_SIZE.high, description="Largest batch size the table covers.")
    logged_prompts: Path = Field(
        description="Folder of weekly prompt logs <logged_prompts>/<YYYY-MM-DD>.jsonl (the Monday, UTC, the week "
                    'starts), one {"prompt": "..."} per line (tabletune_pipelines/formats/prompts.py).')
    published_table: Path = Field(
        description="File the controller loads (atomic writes); the paste-able --speculative-config JSON is "
                    "written beside it as <stem>.speculative-config.json.")
    live_counters: Path | None = Field(
        default=None,
        description="JSONL file the controller exports (format: tabletune_pipelines/formats/live_counters.py).")
    dtype: str | None = Field(
        default=None, min_length=1, description="Model dtype, one of vLLM's --dtype choices (auto, half, float16, "
        "bfloat16, float, float32); null: bfloat16 on a GPU and on a CPU with native bf16 (avx512_bf16 or AMX), else "
        "float32 (tabletune_pipelines/engine/dtype.py). Part of the engine identity.")
    cudagraph_mode: str | None = Field(
        default=None, min_length=1, description="CUDA-graph mode of the serving path, one of vLLM's CUDAGraphMode "
        "names in any case (NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE); passed to every measurement "
        "launch on a GPU (--compilation-config cudagraph_mode) and to the published serving flags. Part of the engine "
        'identity; null: "none" on the CPU build (eager), "default" (whatever vLLM picks) on a GPU.')
    max_cudagraph_capture_size: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Largest CUDA-graph capture size in tokens the deployment serves "
        "with (--compilation-config max_cudagraph_capture_size), at most max_num_batched_tokens; null: vLLM's rule, "
        "min(max_num_seqs·(1+K)·2, 512). "
        "Part of the engine identity (the graph envelope); ignored on the CPU build.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=10_000_000, description="--max-num-batched-tokens the deployment serves with, at least "
        "max_num_seqs·(1+max_k) (one decode step of every request with its drafts); null: vLLM's default. Part of the "
        "engine identity when set.")
    model_runner: ModelRunner = Field(
        default=DEFAULT_MODEL_RUNNER,
        description="vLLM model runner of measurement launches: auto (vLLM's default), v1 or v2 "
                    "(docs/engine-facts.md, \"GPU (H200, vLLM 0.26)\").")
    load_format: str | None = Field(
        default=None, description='vLLM --load-format of measurement launches (e.g. "dummy": shapes only, no '
                                  "weights; timing does not depend on weight values).")
    engine_group: str = Field(
        default="", description="Runs with the same engine group never overlap (default: the deployment name).")
    temperature: float = Field(
        default=DEFAULT_TEMPERATURE, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False,
        description="Sampling temperature of acceptance measurement (the serving temperature).")
    max_prompts: int = Field(default=DEFAULT_SAMPLE_SIZE, ge=1, le=MAX_PROMPTS,
                             description="Prompts sampled per acceptance run.")
    speculative_config: dict[str, Any] = Field(
        default_factory=dict, description="Extra --speculative-config keys (e.g. prompt_lookup_max for ngram); "
                                          "not method, model, num_speculative_tokens or the table.",
        json_schema_extra=_keys_other_than(RESERVED_SPECULATIVE_KEYS))
    controller: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the online controller plugin (docs/controller.md; "
                    "tabletune_pipelines/formats/controller_settings.py), except export_path: the "
                    "controller exports to live_counters.",
        json_schema_extra=_keys_other_than(RESERVED_CONTROLLER_KEYS))
    k8s: K8sPlacement | None = Field(default=None, description="Where this deployment's runs go on Kubernetes.")
    context_levels: tuple[int, ...] | None = Field(
        default=None, description="Context levels of the profile in tokens, ascending: every step-time cell is "
        "measured with its requests' prompts this long (engine/plan.py, propose_context_levels); null: one level, "
        "the profile's prompt_tokens.")

    _levels = field_validator("context_levels", mode="before")(lambda cls, v: check_context_levels(v))

    @field_validator("name", "engine_group")
    @classmethod
    def _names(cls, v: str, info: ValidationInfo) -> str:
        return check_name(v, info.field_name) if v else v

    @field_validator("endpoint", "model", "drafter", mode="before")
    @classmethod
    def _expanded(cls, v: Any, info: ValidationInfo) -> Any:
        return _expand(v, info.field_name) if isinstance(v, str) else v

    @field_validator("model", "drafter")
    @classmethod
    def _not_an_option(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and (not v.strip() or v.startswith("-")):
            raise problem(f"{info.field_name!r} = {v!r} must be a model name or path (vLLM would read a leading "
                           "'-' as an option)")
        return v if v is None else one_line(v, info.field_name)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str) -> str:
        if v.startswith("-"):
            raise problem(f"'gpu' = {v!r} must be an accelerator name, not an option")
        return one_line(v, "gpu", 128)

    @field_validator("dtype", "cudagraph_mode", "load_format")
    @classmethod
    def _tokens(cls, v: str | None, info: ValidationInfo) -> str | None:
        v = check_token(v, info.field_name)
        vocabulary = {"dtype": VLLM_DTYPES, "cudagraph_mode": VLLM_CUDAGRAPH_MODES}.get(str(info.field_name))
        if v is not None and vocabulary and v.upper() not in {x.upper() for x in vocabulary}:
            raise problem(f"{info.field_name!r} = {v!r} is not one of vLLM's {list(vocabulary)} (any case)")
        return v

    @field_validator("speculative_config")
    @classmethod
    def _no_reserved_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, owner in RESERVED_SPECULATIVE_KEYS.items():
            if key in v:
                where = f"set it with the deployment's {owner!r}" if owner else "TableTune writes the table itself"
                raise problem(f"'speculative_config' sets {key!r}, which it may not override; {where}")
        json_value(v, "speculative_config")
        return v

    @field_validator("controller")
    @classmethod
    def _controller_settings(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, owner in RESERVED_CONTROLLER_KEYS.items():
            if key in v:
                raise problem(f"'controller' sets {key!r}, which it may not override; set the deployment's "
                               f"{owner!r} (what the controller exports is what the pipeline reads)")
        json_value(v, "controller")
        # The one vocabulary of these settings (the published file is checked against it again, inside vLLM).
        try:
            ControllerSettings.from_mapping(v, where="'controller'")
        except SettingsError as exc:
            raise problem(str(exc)) from None
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        v = v.rstrip("/")
        if v != EMBEDDED and not _URL_RE.fullmatch(v):
            raise problem(f"'endpoint' = {v!r} must be 'embedded' or an http(s):// URL of a vLLM server")
        return v

    @field_validator("logged_prompts", "published_table", "live_counters", mode="before")
    @classmethod
    def _paths(cls, v: Any, info: ValidationInfo) -> Any:
        return _path(v, info)

    @field_validator("live_counters")
    @classmethod
    def _counters_target(cls, v: Path | None) -> Path | None:
        # The controller appends to this file: refused up front unless it is absent or a live counters
        # file (the controller checks again before every append; one rule, in live_counters).
        from tabletune_pipelines.formats.live_counters import check_live_counters_target

        if v is not None:
            try:
                check_live_counters_target(v)
            except LiveCountersError as exc:
                raise problem(f"'live_counters': {exc}") from None
        return v

    @field_validator("k8s", mode="before")
    @classmethod
    def _empty_k8s(cls, v: Any) -> Any:
        return None if v == {} else v

    @model_validator(mode="after")
    def _graph_envelope(self) -> Deployment:
        # One decode step of every request with K drafts must fit the token budget (else the steps the
        # table is measured on are split), and no graph is captured for more tokens than a step holds.
        budget, ceiling = self.max_num_batched_tokens, self.max_cudagraph_capture_size
        step = self.max_num_seqs * (1 + self.max_k)
        if budget is not None and budget < step:
            raise problem(f"'max_num_batched_tokens' = {budget} is below max_num_seqs x (1 + max_k) = {step}: a "
                           "decode step of every request with its drafts would not fit one step")
        if budget is not None and ceiling is not None and ceiling > budget:
            raise problem(f"'max_cudagraph_capture_size' = {ceiling} is above 'max_num_batched_tokens' = {budget}: "
                           "no step holds that many tokens (vLLM truncates the ceiling); set it at most the budget")
        return self

    @model_validator(mode="after")
    def _drafter_matches_method(self) -> Deployment:
        if self.method == "ngram" and self.drafter:
            raise problem(f"'drafter' = {self.drafter!r} must be null for method 'ngram'")
        if self.method != "ngram" and not self.drafter:
            raise problem(f"'drafter' is null but method {self.method!r} needs a draft model")
        return self

    @property
    def embedded(self) -> bool:
        return self.endpoint == EMBEDDED

    @property
    def group(self) -> str:
        """Runs with the same engine group never overlap (run tag ``tabletune/engine``)."""
        return self.engine_group or self.name

    def prompts_file(self, week: str) -> Path:
        """Logged prompts of the week starting on ``week`` (a Monday, ``YYYY-MM-DD``)."""
        return self.logged_prompts / f"{week}.jsonl"

    @property
    def speculative_config_path(self) -> Path:
        """The paste-able ``--speculative-config`` JSON written beside the published table."""
        return _companion_of(self.published_table)

    def written_files(self) -> list[tuple[Path, str]]:
        """The files TableTune or its controller write for this deployment, each with its fleet key."""
        out = [(self.published_table, "published_table"),
               (self.speculative_config_path, "published_table's speculative-config companion")]
        if self.live_counters is not None:
            out.append((self.live_counters, "live_counters"))
        return out

    def base_speculative_config(self) -> dict[str, Any]:
        """``--speculative-config`` keys other than the table and K."""
        cfg: dict[str, Any] = {"method": self.method}
        if self.drafter:
            cfg["model"] = self.drafter
        cfg.update(self.speculative_config)
        return cfg


class Fleet(_Schema):
    """The whole fleet file."""

    schema_version: int = Field(description=f"Must be {FLEET_SCHEMA_VERSION}.")
    deployments: tuple[Deployment, ...] = Field(strict=False, description="At least one deployment.")
    _source: str = PrivateAttr(default="<string>")

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != FLEET_SCHEMA_VERSION:
            raise problem(f"schema_version {v!r} is not supported (this TableTune reads {FLEET_SCHEMA_VERSION})")
        return v

    @field_validator("deployments")
    @classmethod
    def _unique(cls, v: tuple[Deployment, ...], info: ValidationInfo) -> tuple[Deployment, ...]:
        if not v:
            raise problem("'deployments' is empty; describe at least one deployment")
        seen: set[str] = set()
        for d in v:
            if d.name in seen:
                raise problem(f"deployment name {d.name!r} appears twice; give each deployment its own name")
            seen.add(d.name)
        # Files TableTune writes: never shared between deployments or two keys, never the store or
        # the fleet file itself (publishing would replace them).
        fleet_file = (info.context or {}).get("fleet_file")
        others: dict[Path, str] = {_resolved(default_store_path()): "the DuckDB store (TABLETUNE_DUCKDB)"}
        if fleet_file is not None:
            others[_resolved(Path(fleet_file))] = "the fleet file itself"
        for d in v:
            for path, key in d.written_files():
                r = _resolved(path)
                if r in others:
                    raise problem(f"deployment {d.name!r}: {key} = {str(path)!r} is also {others[r]}; give each "
                                   "file TableTune writes its own path")
                others[r] = f"deployment {d.name!r}'s {key}"
        return v

    @property
    def source(self) -> str:
        """The file the fleet was loaded from (``<string>`` when parsed from data)."""
        return self._source

    def deployment(self, name: str) -> Deployment:
        for d in self.deployments:
            if d.name == name:
                return d
        raise FleetError(f"deployment {name!r} is not in the fleet file {self.source} "
                         f"(deployments: {[d.name for d in self.deployments]})")

    def groups(self) -> dict[str, list[Deployment]]:
        out: dict[str, list[Deployment]] = {}
        for d in self.deployments:
            out.setdefault(d.group, []).append(d)
        return out


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare the path as written
        return path.expanduser().absolute()


def fleet_json_schema() -> dict[str, Any]:
    """The fleet file's schema as JSON Schema (field types, bounds, defaults, descriptions)."""
    return Fleet.model_json_schema()


# -- pydantic's errors as the project's messages -------------------------------------------------

_TYPE_WORDS = {
    "int_type": "an integer", "int_from_float": "an integer", "string_type": "a string", "float_type": "a number",
    "bool_type": "true or false", "dict_type": "a mapping", "list_type": "a list", "tuple_type": "a list",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "path_type": "a path (a string)",
    "none_required": "null",
}
_BOUND_WORDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def _describe(err: Mapping[str, Any], data: Any, source: str) -> str:
    """One line for one pydantic error: ``fleet file F, deployment 'd', k8s: 'key' ... what to do``."""
    loc = list(err["loc"])
    where = f"fleet file {source}"
    model: type[BaseModel] = Fleet
    if loc[:1] == ["deployments"] and len(loc) >= 2 and isinstance(loc[1], int):
        i = loc[1]
        listed = data.get("deployments") if isinstance(data, dict) else None
        raw = listed[i] if isinstance(listed, list) else None
        name = raw.get("name") if isinstance(raw, dict) else None
        where += f", deployment {name!r}" if isinstance(name, str) else f", deployments[{i}]"
        loc, model = loc[2:], Deployment
        if loc[:1] == ["k8s"] and len(loc) > 1:
            where += ", k8s"
            loc, model = loc[1:], K8sPlacement
    key = ".".join(str(x) for x in loc if x != "[key]")
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "missing":
        what = f"missing required key {key!r}"
    elif kind == "extra_forbidden":
        what = f"unknown key {key!r}; allowed keys are {_allowed_keys(model)}"
    elif kind in ("model_type", "model_attributes_type", "dict_type") and not loc:
        what = (f"each deployment must be a mapping, got {type(value).__name__}" if model is Deployment
                else "the top level must be a mapping with 'schema_version' and 'deployments'")
    elif kind in _TYPE_WORDS and "[key]" in loc:
        parent = ".".join(str(x) for x in loc[:loc.index("[key]") - 1])
        what = f"{parent!r} has the key {value!r}; keys must be {_TYPE_WORDS[kind]}"
    elif kind in _TYPE_WORDS:
        what = f"{key!r} = {value!r} must be {_TYPE_WORDS[kind]}"
    elif kind in _BOUND_WORDS:
        bound = next(iter(ctx.values()))
        what = f"{key!r} = {value!r} must be {_BOUND_WORDS[kind]} {bound}"
    elif kind == "finite_number":
        what = f"{key!r} = {value!r} must be a finite number"
    elif kind == "literal_error":
        what = f"{key!r} = {value!r} must be one of {ctx.get('expected')}"
    elif kind == "string_too_short":
        what = f"{key!r} = {value!r} must not be empty"
    elif kind == "tabletune":
        what = ctx["message"]
    else:
        what = f"{key!r} = {value!r}: {err['msg']}" if key else err["msg"]
    return f"{where}: {what}"


def parse_fleet(data: Any, source: str = "<string>", base_dir: Path | None = None) -> Fleet:
    """Validate a parsed fleet document strictly; every problem is one line of the FleetError."""
    context: dict[str, Any] = {"base_dir": base_dir or Path.cwd()}
    if base_dir is not None and source != "<string>":
        context["fleet_file"] = Path(source)
    try:
        fleet = Fleet.model_validate(data, context=context)
    except ValidationError as exc:
        lines = list(dict.fromkeys(_describe(e, data, source) for e in exc.errors()))
        raise FleetError("\n".join(lines)) from None
    fleet._source = source
    return fleet


def load_fleet(path: str | os.PathLike[str] | None = None) -> Fleet:
    """Load and validate the fleet file: ``path``, else ``$TABLETUNE_FLEET``, else the embedded default.

    Relative paths inside the file are resolved against the file's folder.
    """
    p = Path(path or os.environ.get("TABLETUNE_FLEET") or DEFAULT_FLEET_PATH).expanduser()
    data = read_fleet_yaml(p)
    return parse_fleet(data, source=str(p), base_dir=p.resolve().parent)



if __name__ == "__main__":  # python -m tabletune_pipelines.formats.fleet: the schema, for editors and reviewers
    import json

    print(json.dumps(fleet_json_schema(), indent=2))
