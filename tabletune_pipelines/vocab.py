"""The project's vocabularies and defaults, written once.

Each ``Literal`` alias types the dataclass fields that hold one of its words; the matching tuple
(``*_VALUES``, from ``typing.get_args``) feeds argparse ``choices`` and runtime checks, so a word
is added in one place. Stdlib only: the controller inside vLLM imports this too.
"""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

ProfileMode = Literal["one_launch", "launch_per_k", "fixed_k"]
"""How a profile's cells were launched: ``one_launch`` (every k in one launch at K, switched at
runtime), ``launch_per_k`` (a launch at K per k with a one-range table), ``fixed_k`` (a launch per
k >= 1 with K = k and no table: the baseline of the engine-dependence check, docs/method.md,
"Limitations" 1)."""

DraftVerdict = Literal["reject", "accept"]
"""The verdict a timed cell forces on every draft (synthetic acceptance): every draft rejected (the
method's timing protocol) or every draft accepted (the accepted-token work check, docs/method.md,
"Limitations" 2). Stored as a cell's ``acceptance`` field."""

TimingSource = Literal["engine", "wall"]
"""``engine``: intervals between the scheduler's step updates; ``wall``: (t65 - t1) / 64 from the
client (docs/method.md, "Step time T(B, k)")."""

PriorSource = Literal["measured", "synthetic", "live"]
"""Where an acceptance prior's rates came from: an offline run on logged prompts, a launch with
known synthetic rates, or the controller's exported live counters."""

Method = Literal["draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix", "dflash"]
"""vLLM speculative methods TableTune can launch (``speculative_config.method``)."""

ModelDrafterMethod = Literal["draft_model", "eagle", "eagle3", "dflash"]
"""Methods whose drafter is a separate model given by path or hub name."""

Device = Literal["auto", "cpu", "gpu"]
"""Where the engine runs: ``auto`` picks the CPU build when it is the vLLM installed."""

ModelRunner = Literal["auto", "v1", "v2"]
"""vLLM model runner: ``auto`` leaves vLLM's default; ``v1``/``v2`` force one (V2 keeps full CUDA
graphs per k, docs/engine-facts.md, "GPU (H200, vLLM 0.26)")."""

ControllerMode = Literal["control", "observe"]
"""The online controller's mode: ``control`` rebuilds the table and rewrites vLLM's lookup;
``observe`` serves the published table as it is and only counts, estimates and exports."""

SearchRule = Literal["evidence", "stickiness"]
"""How the table search moves between k values: ``evidence`` (only where the goodput gain's lower
confidence bound exceeds the stickiness threshold) or ``stickiness`` (the method's rule: where the
point estimate does; docs/method.md, "Table search")."""

GraphMode = Literal["full", "piecewise", "none"]
"""How a step ran on a GPU: one full CUDA graph, piecewise graphs (attention eager), or no graphs
(above the capture ceiling, or an engine without graphs such as the CPU build)."""

ContextAggregate = Literal["mean", "median", "max"]
"""How one step's context length is read from its running requests' context lengths, to pick the
column of a (batch size, context) table (vLLM's ``ctx_agg``); TableTune serves ``mean``."""

WindowKind = Literal["time", "requests"]
"""What a served window counts (``ServedVerificationOptions.window``): ``time``, ``window_s`` seconds
of a closed loop that keeps running across windows (``served_windows.measure_window``); ``requests``,
a fixed set of requests per round served from an idle engine until all are answered
(``served_windows.measure_requests_window``), the same for every policy of the round."""

PROFILE_MODES: tuple[str, ...] = get_args(ProfileMode)
WINDOW_KINDS: tuple[str, ...] = get_args(WindowKind)
CONTEXT_AGGREGATES: tuple[str, ...] = get_args(ContextAggregate)
GRAPH_MODES: tuple[str, ...] = get_args(GraphMode)
SEARCH_RULES: tuple[str, ...] = get_args(SearchRule)
DRAFT_VERDICTS: tuple[str, ...] = get_args(DraftVerdict)
TIMING_SOURCES: tuple[str, ...] = get_args(TimingSource)
PRIOR_SOURCES: tuple[str, ...] = get_args(PriorSource)
METHODS: tuple[str, ...] = get_args(Method)
MODEL_DRAFTERS: tuple[str, ...] = get_args(ModelDrafterMethod)
DEVICES: tuple[str, ...] = get_args(Device)
MODEL_RUNNERS: tuple[str, ...] = get_args(ModelRunner)
CONTROLLER_MODES: tuple[str, ...] = get_args(ControllerMode)


def is_search_rule(word: object) -> TypeGuard[SearchRule]:
    """Whether ``word`` is one of ``SEARCH_RULES``: narrows a setting read as ``str`` to ``SearchRule``."""
    return word in SEARCH_RULES


def is_profile_mode(word: object) -> TypeGuard[ProfileMode]:
    """Whether ``word`` is one of ``PROFILE_MODES``: narrows a mode read as ``str`` to ``ProfileMode``."""
    return word in PROFILE_MODES


VLLM_CUDAGRAPH_MODES: tuple[str, ...] = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM's ``CUDAGraphMode`` names (``--compilation-config '{"cudagraph_mode": ...}'``): a fleet's
``cudagraph_mode`` is one of them, in any case; launches pass it (``vllm_compilation_config``)."""
VLLM_DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")
"""vLLM's ``--dtype`` choices: the model dtypes a fleet's ``dtype`` may name (``float8`` is a
quantization or a KV-cache dtype, not a model dtype)."""


def vllm_compilation_config(cudagraph_mode: str | None, capture_ceiling: int | None) -> dict[str, object]:
    """The ``--compilation-config`` keys of a launch on a GPU, one rule for every measurement launch
    and the published serving flags: the declared CUDA-graph mode (upper case: vLLM's
    ``CUDAGraphMode`` name; left to vLLM when None or ``default``) and the capture ceiling when given
    (none under mode ``none``: no graphs are captured)."""
    mode = None if cudagraph_mode is None or cudagraph_mode.lower() == "default" else cudagraph_mode.upper()
    out: dict[str, object] = {} if mode is None else {"cudagraph_mode": mode}
    if capture_ceiling is not None and mode != "NONE":
        out["max_cudagraph_capture_size"] = int(capture_ceiling)
    return out

# -- defaults ----------------------------------------------------------------------------------

DEFAULT_SAMPLE_SIZE = 160
"""Prompts sampled per acceptance measurement (docs/method.md, "Acceptance")."""
DEFAULT_DTYPE = "bfloat16"
"""Dtype of an identity document that names none (stores written before the CPU-aware default all
used it). Launches without a dtype take the device's default: ``engine/dtype.py``."""
DEFAULT_CUDAGRAPH_MODE = "none"
"""CUDA-graph mode recorded in an engine identity when the fleet does not say (eager, e.g. CPU)."""
DEFAULT_TEMPERATURE = 0.0
"""Sampling temperature of acceptance measurement (should equal serving's)."""
DEFAULT_REPETITIONS = 3
"""Repetitions per timed cell; the cell is their median (docs/method.md, "Step time T(B, k)")."""
DEFAULT_PROMPT_TOKENS = 32
"""Tokens of each timing prompt, and so the one context level of a profile that names none: the
context level of every step-time cell stored before cells carried one."""
DEFAULT_PROFILE_MODE: ProfileMode = "one_launch"
"""Profile mode of ``tabletune profile`` and the pipeline."""
DEFAULT_MODEL_RUNNER: ModelRunner = "auto"
"""Model runner of a deployment that does not choose one."""
STORE_FILENAME = "tabletune_store.duckdb"
"""DuckDB file under ``$TABLETUNE_HOME`` (not named like a schema inside it: docs/engine-facts.md)."""

# -- bounds ------------------------------------------------------------------------------------

MAX_STEP_MS = 1e7
"""Longest step time any cell, repetition or published ``step_ms`` may hold (10^7 ms, 2.8 hours: no
decode step takes that long, so a larger value is a damaged row, not a measurement; squared it
stays far from float overflow)."""
