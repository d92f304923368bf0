"""The fleet file: which vLLM deployments TableTune tunes, and where their data lives.

Schema (version 1). Every key below is the whole vocabulary: an unknown key anywhere, a missing
required key, or a value of the wrong type is an error that names the file, the deployment and
the key. ``${VAR}`` and ``${VAR:-default}`` are expanded in string values (``TABLETUNE_HOME``
defaults to ``~/.tabletune``); an unset variable without a default is an error.

.. code-block:: yaml

    schema_version: 1                 # required, must be 1
    deployments:                      # required, at least one
      - name: local-cpu               # required; unique; [A-Za-z0-9._-]+
        endpoint: embedded            # required; "embedded" (vLLM installed here, the CPU build
                                      #   by default) or the http(s) base URL of a vLLM server
                                      #   (its GET /version gives the engine version)
        gpu: cpu                      # required; accelerator type ("cpu", "H100", "A10G", ...)
        model: tiny:small             # required; target model (hub name, path, or "tiny:<size>"
                                      #   for the project's tiny local models)
        drafter: tiny:small           # required, may be null (n-gram); draft model
        method: draft_model           # required; draft_model | ngram | eagle | eagle3 | mtp | ...
        max_k: 3                      # required; launch num_speculative_tokens
        max_num_seqs: 16              # required; largest batch size the table covers
        logged_prompts: /data/prompts # required; folder of weekly prompt logs, one file per week:
                                      #   <logged_prompts>/<YYYY-MM-DD>.jsonl, the date being the
                                      #   Monday (UTC) the week starts; each line a JSON object
                                      #   with a "prompt" string (other keys are ignored)
        published_table: /data/t.json # required; file the controller loads (atomic writes); the
                                      #   paste-able --speculative-config JSON is written beside it
                                      #   as <stem>.speculative-config.json
        live_counters: null           # optional; JSONL file the controller exports
                                      #   (format: tabletune_pipelines.live_counters)
        dtype: bfloat16               # optional
        cudagraph_mode: none          # optional; the serving path's CUDA-graph mode
        engine_group: local-cpu       # optional; runs with the same engine_group never overlap
                                      #   (default: the deployment name)
        temperature: 0.0              # optional; sampling temperature of acceptance measurement
        max_prompts: 160              # optional; prompts sampled per weekly acceptance run
        speculative_config: {}        # optional; extra --speculative-config keys (e.g.
                                      #   prompt_lookup_max for ngram)
        k8s:                          # optional; where this deployment's runs go on Kubernetes
          node_selector: {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
          gpu_resource: nvidia.com/gpu   # optional (default nvidia.com/gpu; null on CPU)
          gpu_count: 1                    # optional (default 1)
          tolerations: []                 # optional, Kubernetes toleration objects
          image: null                     # optional; image with the deployment's vLLM version
          service_account: null           # optional
          resources: {}                   # optional; extra container resources (cpu, memory)

The embedded default (``fleet.yaml`` at the repository root) describes one local deployment on
the CPU build with the project's tiny models. ``TABLETUNE_FLEET`` points at another file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tabletune_pipelines.errors import TableTuneError

FLEET_SCHEMA_VERSION = 1
EMBEDDED = "embedded"
#: Repository root fleet file, used when TABLETUNE_FLEET is not set.
DEFAULT_FLEET_PATH = Path(__file__).resolve().parents[1] / "fleet.yaml"
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class FleetError(TableTuneError, ValueError):
    """The fleet file is missing, malformed, or does not follow the schema."""


def tabletune_home() -> Path:
    """``$TABLETUNE_HOME`` or ``~/.tabletune``: where the embedded default keeps its data."""
    return Path(os.environ.get("TABLETUNE_HOME") or "~/.tabletune").expanduser()


@dataclass(frozen=True)
class K8sPlacement:
    """Kubernetes placement of a deployment's runs (see deploy/k8s/README.md)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    gpu_resource: str | None = "nvidia.com/gpu"
    gpu_count: int = 1
    tolerations: tuple[Mapping[str, Any], ...] = ()
    image: str | None = None
    service_account: str | None = None
    resources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment of the fleet."""

    name: str
    endpoint: str
    gpu: str
    model: str
    drafter: str | None
    method: str
    max_k: int
    max_num_seqs: int
    logged_prompts: Path
    published_table: Path
    live_counters: Path | None = None
    dtype: str = "bfloat16"
    cudagraph_mode: str = "none"
    engine_group: str = ""
    temperature: float = 0.0
    max_prompts: int = 160
    speculative_config: Mapping[str, Any] = field(default_factory=dict)
    k8s: K8sPlacement | None = None

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
        p = self.published_table
        return p.with_name(p.stem + ".speculative-config.json")

    def base_speculative_config(self) -> dict[str, Any]:
        """``--speculative-config`` keys other than the table and K."""
        cfg: dict[str, Any] = {"method": self.method}
        if self.drafter:
            cfg["model"] = self.drafter
        cfg.update(dict(self.speculative_config))
        return cfg


@dataclass(frozen=True)
class Fleet:
    deployments: tuple[Deployment, ...]
    source: str

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


# -- loading -------------------------------------------------------------------------------

_TOP_REQUIRED = {"schema_version": int, "deployments": list}
_DEP_REQUIRED: dict[str, Any] = {
    "name": str, "endpoint": str, "gpu": str, "model": str, "drafter": (str, type(None)), "method": str,
    "max_k": int, "max_num_seqs": int, "logged_prompts": str, "published_table": str,
}
_DEP_OPTIONAL: dict[str, Any] = {
    "live_counters": (str, type(None)), "dtype": str, "cudagraph_mode": str, "engine_group": str,
    "temperature": (int, float), "max_prompts": int, "speculative_config": dict, "k8s": (dict, type(None)),
}
_K8S_KEYS: dict[str, Any] = {
    "node_selector": dict, "gpu_resource": (str, type(None)), "gpu_count": int, "tolerations": list,
    "image": (str, type(None)), "service_account": (str, type(None)),
    "resources": dict,
}


def _type_name(t: Any) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    names = {"str": "a string", "int": "an integer", "dict": "a mapping", "list": "a list", "float": "a number"}
    return " or ".join("null" if x is type(None) else names.get(x.__name__, x.__name__) for x in ts)


def _check_type(where: str, key: str, value: Any, t: Any) -> None:
    ts = t if isinstance(t, tuple) else (t,)
    if isinstance(value, bool) and bool not in ts:
        ok = False
    else:
        ok = isinstance(value, ts)
    if not ok:
        raise FleetError(f"{where}: {key!r} = {value!r} must be {_type_name(t)}")


def _check_keys(where: str, data: Mapping[str, Any], required: Mapping[str, Any], optional: Mapping[str, Any]) -> None:
    allowed = set(required) | set(optional)
    for key in data:
        if key not in allowed:
            raise FleetError(f"{where}: unknown key {key!r}; allowed keys are {sorted(allowed)}")
    for key in required:
        if key not in data:
            raise FleetError(f"{where}: missing required key {key!r}")
    for key, value in data.items():
        _check_type(where, key, value, required.get(key, optional.get(key)))


def _expand(where: str, key: str, value: str) -> str:
    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ and os.environ[name] != "":
            return os.environ[name]
        if name == "TABLETUNE_HOME":
            return str(tabletune_home())
        if default is not None:
            return default
        raise FleetError(f"{where}: {key!r} uses ${{{name}}}, which is not set (set it or write ${{{name}:-default}})")

    return _VAR_RE.sub(repl, value)


def _path(where: str, key: str, value: str, base: Path) -> Path:
    p = Path(_expand(where, key, value)).expanduser()
    return p if p.is_absolute() else (base / p)


def _parse_k8s(where: str, data: Mapping[str, Any]) -> K8sPlacement:
    where = f"{where}, k8s"
    _check_keys(where, data, {}, _K8S_KEYS)
    ns = data.get("node_selector", {})
    for k, v in ns.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise FleetError(f"{where}: node_selector entry {k!r}: {v!r} must map strings to strings")
    if data.get("gpu_count", 1) < 0:
        raise FleetError(f"{where}: 'gpu_count' = {data['gpu_count']!r} must be >= 0")
    tols = data.get("tolerations", [])
    for t in tols:
        if not isinstance(t, dict):
            raise FleetError(f"{where}: toleration {t!r} must be a mapping (a Kubernetes toleration)")
    res = {str(k): str(v) for k, v in data.get("resources", {}).items()}
    return K8sPlacement(
        node_selector=dict(ns), gpu_resource=data.get("gpu_resource", "nvidia.com/gpu"),
        gpu_count=int(data.get("gpu_count", 1)), tolerations=tuple(dict(t) for t in tols),
        image=data.get("image"), service_account=data.get("service_account"),
        resources=res,
    )


def _parse_deployment(source: str, index: int, data: Any, base: Path) -> Deployment:
    where = f"fleet file {source}, deployments[{index}]"
    if not isinstance(data, dict):
        raise FleetError(f"{where}: each deployment must be a mapping, got {type(data).__name__}")
    if isinstance(data.get("name"), str):
        where = f"fleet file {source}, deployment {data['name']!r}"
    _check_keys(where, data, _DEP_REQUIRED, _DEP_OPTIONAL)
    name = data["name"]
    if not _NAME_RE.match(name):
        raise FleetError(f"{where}: 'name' = {name!r} may only use letters, digits, '.', '_' and '-'")
    endpoint = _expand(where, "endpoint", data["endpoint"]).rstrip("/")
    if endpoint != EMBEDDED and not re.match(r"^https?://[^/\s]+", endpoint):
        raise FleetError(f"{where}: 'endpoint' = {endpoint!r} must be 'embedded' or an http(s):// URL of a vLLM server")
    for key in ("max_k", "max_num_seqs"):
        if data[key] < 1:
            raise FleetError(f"{where}: {key!r} = {data[key]!r} must be >= 1")
    if data.get("max_prompts", 160) < 1:
        raise FleetError(f"{where}: 'max_prompts' = {data['max_prompts']!r} must be >= 1")
    if data["method"] == "ngram" and data["drafter"]:
        raise FleetError(f"{where}: 'drafter' = {data['drafter']!r} must be null for method 'ngram'")
    if data["method"] != "ngram" and not data["drafter"]:
        raise FleetError(f"{where}: 'drafter' is null but method {data['method']!r} needs a draft model")
    group = data.get("engine_group", "")
    if group and not _NAME_RE.match(group):
        raise FleetError(f"{where}: 'engine_group' = {group!r} may only use letters, digits, '.', '_' and '-'")
    live = data.get("live_counters")
    return Deployment(
        name=name, endpoint=endpoint, gpu=data["gpu"], model=_expand(where, "model", data["model"]),
        drafter=_expand(where, "drafter", data["drafter"]) if data["drafter"] else None, method=data["method"],
        max_k=data["max_k"], max_num_seqs=data["max_num_seqs"],
        logged_prompts=_path(where, "logged_prompts", data["logged_prompts"], base),
        published_table=_path(where, "published_table", data["published_table"], base),
        live_counters=_path(where, "live_counters", live, base) if live else None,
        dtype=data.get("dtype", "bfloat16"), cudagraph_mode=data.get("cudagraph_mode", "none"),
        engine_group=group, temperature=float(data.get("temperature", 0.0)),
        max_prompts=data.get("max_prompts", 160), speculative_config=dict(data.get("speculative_config", {})),
        k8s=_parse_k8s(where, data["k8s"]) if data.get("k8s") else None,
    )


def parse_fleet(data: Any, source: str = "<string>", base_dir: Path | None = None) -> Fleet:
    """Validate a parsed fleet document strictly (see the module docstring for the schema)."""
    where = f"fleet file {source}"
    if not isinstance(data, dict):
        raise FleetError(f"{where}: the top level must be a mapping with 'schema_version' and 'deployments'")
    _check_keys(where, data, _TOP_REQUIRED, {})
    if data["schema_version"] != FLEET_SCHEMA_VERSION:
        raise FleetError(f"{where}: schema_version {data['schema_version']!r} is not supported "
                         f"(this TableTune reads {FLEET_SCHEMA_VERSION})")
    if not data["deployments"]:
        raise FleetError(f"{where}: 'deployments' is empty; describe at least one deployment")
    base = base_dir or Path.cwd()
    deps = tuple(_parse_deployment(source, i, d, base) for i, d in enumerate(data["deployments"]))
    seen: set[str] = set()
    for d in deps:
        if d.name in seen:
            raise FleetError(f"{where}: deployment name {d.name!r} appears twice")
        seen.add(d.name)
    return Fleet(deployments=deps, source=source)


def load_fleet(path: str | os.PathLike[str] | None = None) -> Fleet:
    """Load and validate the fleet file: ``path``, else ``$TABLETUNE_FLEET``, else the embedded default.

    Relative paths inside the file are resolved against the file's folder.
    """
    p = Path(path or os.environ.get("TABLETUNE_FLEET") or DEFAULT_FLEET_PATH).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FleetError(f"fleet file {p} does not exist (set TABLETUNE_FLEET or pass the path)") from None
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {p}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {p} is not valid YAML: {exc}") from None
    return parse_fleet(data, source=str(p), base_dir=p.resolve().parent)


# -- run placement -------------------------------------------------------------------------

ENGINE_TAG = "tabletune/engine"
DEPLOYMENT_TAG = "tabletune/deployment"
K8S_CONFIG_TAG = "dagster-k8s/config"


def k8s_config(dep: Deployment) -> dict[str, Any] | None:
    """The ``dagster-k8s/config`` tag body placing this deployment's runs on its GPU nodes.

    Read by dagster-k8s's ``K8sRunLauncher`` (run pods) and ``k8s_job_executor`` (step pods):
    node selector + tolerations for the GPU type, a GPU resource limit (so the scheduler gives the
    pod a whole GPU and no other profiling pod shares it), and optionally the image carrying the
    deployment's vLLM version.
    """
    k = dep.k8s
    if k is None:
        return None
    limits: dict[str, str] = dict(k.resources)
    if k.gpu_resource and k.gpu_count > 0:
        limits[k.gpu_resource] = str(k.gpu_count)
    container: dict[str, Any] = {}
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if k.image:
        container["image"] = k.image
    pod_spec: dict[str, Any] = {}
    if k.node_selector:
        pod_spec["node_selector"] = dict(k.node_selector)
    if k.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in k.tolerations]
    if k.service_account:
        pod_spec["service_account_name"] = k.service_account
    labels = {"tabletune/deployment": dep.name, "tabletune/gpu": re.sub(r"[^A-Za-z0-9._-]", "-", dep.gpu)[:63]}
    return {
        "container_config": container,
        "pod_spec_config": pod_spec,
        "pod_template_spec_metadata": {"labels": labels},
        "job_metadata": {"labels": labels},
    }


def run_tags(dep: Deployment) -> dict[str, str]:
    """Tags of every run that uses this deployment's engine: the concurrency key
    (``tabletune/engine``, limited to 1 per value in dagster.yaml) and the Kubernetes placement."""
    import json

    tags = {ENGINE_TAG: dep.group, DEPLOYMENT_TAG: dep.name}
    cfg = k8s_config(dep)
    if cfg is not None:
        tags[K8S_CONFIG_TAG] = json.dumps(cfg, sort_keys=True)
    return tags


def default_engine_tag(fleet: Fleet | None) -> str:
    """``tabletune/engine`` value for runs launched by hand: the fleet's only engine group, else "manual"."""
    if fleet is None:
        return "manual"
    groups = fleet.groups()
    return next(iter(groups)) if len(groups) == 1 else "manual"


def try_load_fleet() -> Fleet | None:
    """The fleet at definitions load time, or None if it is invalid (runs then report the error)."""
    try:
        return load_fleet()
    except FleetError:
        return None
