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
* ``method``, ``max_k``, ``max_num_seqs``: equal.

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
"""The identity fields ``identity_mismatches`` compares, in the order it reports them."""
REQUIRED_FIELDS = ("gpu", "vllm_version", "model", "method", "max_k", "max_num_seqs")
"""Fields every ``EngineIdentity`` has (``drafter`` is None for n-gram): a file's identity without one is refused."""

_LABELS = {"max_k": "K (num_speculative_tokens)", "vllm_version": "vLLM", "gpu": "GPU"}
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


def _same(field: str, a: Any, b: Any) -> bool:
    if field in ("model", "drafter"):
        return same_path(str(a), str(b))
    if field == "vllm_version":
        return public_version(a) == public_version(b)
    if field == "gpu":
        return same_gpu(str(a), str(b))
    return a == b


def _show(field: str, v: Any) -> str:
    return str(v) if field in ("max_k", "max_num_seqs") else repr(v)


def identity_mismatches(made_for: Mapping[str, Any], running: Mapping[str, Any], *,
                        fields: Iterable[str] = COMPARED_FIELDS, running_name: str = "this engine's") -> list[str]:
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
