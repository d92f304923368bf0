"""Was this made for that engine? The one comparison of engine identities.

Stdlib only: the controller inside vLLM compares a published file's ``identity`` with the engine it
runs in (``controller/loader.py``), and the library compares a fleet deployment with a stored
identity (``deployments.same_engine``), an old publication with a deployment's engine now (the
rollback job) and the vLLM installed here with a partition's before a measurement
(``deployments.check_local_engine``) — all with ``identity_mismatches`` below, so no two sides disagree.

Both sides are mappings of ``EngineIdentity`` field names (``EngineIdentity.to_dict()``, a
published file's ``identity``, the facts the controller reads from vLLM's config). A field is
compared only where both sides know it (present and not None): the controller cannot learn every
field cheaply, and n-gram drafting has no drafter. The rules per field:

* ``model``, ``drafter``: the same string, or the same real path (``~`` expanded, symlinks resolved);
* ``vllm_version``: the same public version (``0.32.0+cpu`` matches ``0.32.0``);
* ``gpu``: ``same_gpu`` (a fleet's ``H200`` matches the driver's ``NVIDIA H200``; ``cpu`` only ``cpu``);
* ``method``, ``max_k``, ``max_num_seqs``, ``max_num_batched_tokens``: equal;
* ``capture_ceiling``: the same ceiling as vLLM runs it (``vllm_capture_ceiling``: vLLM rounds a
  ceiling down to its capture grid, so 1000 and 992 are one envelope).

``dtype``, ``cudagraph_mode`` and ``model_runner`` are part of an identity's key but not compared:
the engine does not report them in a form that matches the fleet's (a launch's dtype ``auto``, a
graph mode vLLM picks itself).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

COMPARED_FIELDS = ("gpu", "vllm_version", "model", "drafter", "method", "max_k", "max_num_seqs")
"""The engine fields ``identity_mismatches`` compares, in the order it reports them (``same_engine``:
a deployment is the same engine in any graph envelope)."""
ENVELOPE_FIELDS = ("capture_ceiling", "max_num_batched_tokens")
"""The graph envelope: a table is priced for one (docs/method.md, "What a served step costs"), so the
controller, the rollback and a measuring launch compare it too (``ENGINE_AND_ENVELOPE``)."""
ENGINE_AND_ENVELOPE = COMPARED_FIELDS + ENVELOPE_FIELDS
"""What ``identity_mismatches`` compares by default: the engine and its graph envelope."""
REQUIRED_FIELDS = ("gpu", "vllm_version", "model", "method", "max_k", "max_num_seqs")
"""Fields every ``EngineIdentity`` has (``drafter`` is None for n-gram): a file's identity without one is refused."""

_LABELS = {"max_k": "K (num_speculative_tokens)", "vllm_version": "vLLM", "gpu": "GPU",
           "capture_ceiling": "capture ceiling (max_cudagraph_capture_size)",
           "max_num_batched_tokens": "token budget (max_num_batched_tokens)"}
_VENDOR_WORDS = frozenset({"nvidia", "amd", "intel", "tesla"})
_UNKNOWN_GPU = "gpu"
"""What ``engine.identity.accelerator_name`` records for a GPU whose model it could not read."""


def public_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``: the part of a version string before a local label."""
    return str(version).split("+", 1)[0].strip()


def same_path(a: str, b: str) -> bool:
    """Same model name, or the same real path on this machine."""
    if a == b:
        return True
    try:
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
    except (OSError, ValueError):
        return False


def _gpu_words(name: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in _VENDOR_WORDS)


def same_gpu(a: str, b: str) -> bool:
    """Whether two GPU names name the same accelerator type.

    ``cpu`` matches only ``cpu``. ``gpu`` (a GPU whose model was not read) matches any GPU. Otherwise
    the names' words (lower-case letters and digits, vendor words such as ``NVIDIA`` dropped) of one
    must all be words of the other: ``H200`` matches ``NVIDIA H200`` and ``NVIDIA H200 NVL``, but not
    ``NVIDIA H100 80GB HBM3``; ``L40`` does not match ``NVIDIA L40S``.
    """
    la, lb = str(a).strip().lower(), str(b).strip().lower()
    if la == lb:
        return True
    if "cpu" in (la, lb):
        return False
    if _UNKNOWN_GPU in (la, lb):
        return True
    wa, wb = _gpu_words(la), _gpu_words(lb)
    return bool(wa) and bool(wb) and (wa <= wb or wb <= wa)


def vllm_capture_ceiling(requested: int) -> int:
    """The ceiling vLLM captures for a requested ``max_cudagraph_capture_size``: the largest size of
    its capture grid within it (1, 2, 4, multiples of 8 below 256, of 16 from 256; vLLM 0.26/0.32
    ``VllmConfig._set_cudagraph_sizes``, which logs "Truncating max_cudagraph_capture_size")."""
    c = int(requested)
    if c >= 256:
        return 256 + 16 * ((c - 256) // 16)
    if c >= 8:
        return 8 * (c // 8)
    return max((s for s in (1, 2, 4) if s <= c), default=c)


def capture_grid_ceil(tokens: int) -> int:
    """The smallest size of vLLM's capture grid holding ``tokens`` (the grid of ``vllm_capture_ceiling``):
    a ceiling vLLM captures as asked, not truncated."""
    t = max(1, int(tokens))
    if t <= 4:
        return next(s for s in (1, 2, 4) if s >= t)
    if t <= 256:
        return 8 * (-(-t // 8))
    return 256 + 16 * (-(-(t - 256) // 16))


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "capture_ceiling":
        return vllm_capture_ceiling(a) == vllm_capture_ceiling(b)
    if field in ("model", "drafter"):
        return same_path(str(a), str(b))
    if field == "vllm_version":
        return public_version(a) == public_version(b)
    if field == "gpu":
        return same_gpu(str(a), str(b))
    return a == b


def _show(field: str, v: Any) -> str:
    return str(v) if field in ("max_k", "max_num_seqs", *ENVELOPE_FIELDS) else repr(v)


def identity_mismatches(made_for: Mapping[str, Any], running: Mapping[str, Any], *,
                        fields: Iterable[str] = ENGINE_AND_ENVELOPE,
                        running_name: str = "this engine's") -> list[str]:
    """What differs between the identity something was ``made_for`` and the one ``running``, one
    phrase per field (``"model '/m/a' != this engine's '/m/b'"``); empty when nothing known differs.
    Fields unknown on either side (absent or None) are not compared."""
    out = []
    for f in fields:
        a, b = made_for.get(f), running.get(f)
        if a is None or b is None or _same(f, a, b):
            continue
        out.append(f"{_LABELS.get(f, f)} {_show(f, a)} != {running_name} {_show(f, b)}")
    return out


def missing_fields(identity: Mapping[str, Any]) -> list[str]:
    """The fields every engine identity has that ``identity`` lacks (absent, None or empty)."""
    return [f for f in REQUIRED_FIELDS if identity.get(f) in (None, "")]


# -- the running engine's GPU, cheaply --------------------------------------------------------

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
"""The NVIDIA driver's per-GPU folders; each has an ``information`` file with a ``Model:`` line."""


def nvidia_gpu_name(proc: Path = NVIDIA_PROC) -> str | None:
    """The first NVIDIA GPU's model name from the driver's files (``NVIDIA H200``), or None.

    A few small file reads: no ``nvidia-smi``, no CUDA context (which would hold GPU memory in the
    calling process)."""
    for info in sorted(proc.glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    name = line.split(":", 1)[1].strip()
                    if name:
                        return name
        except OSError:
            continue
    return None


def engine_gpu(device_type: str | None) -> str | None:
    """The GPU field of a running engine from vLLM's ``device_config.device_type``: ``cpu`` on the
    CPU build, the NVIDIA GPU's model on ``cuda`` (None when the driver's files do not say), else None."""
    if device_type == "cpu":
        return "cpu"
    if device_type == "cuda":
        return nvidia_gpu_name()
    return None
