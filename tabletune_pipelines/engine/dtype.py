"""Which model dtype a launch uses when nobody chose one: the one place that decides.

On a GPU the answer is bfloat16 (every GPU TableTune targets computes it natively). On vLLM's
CPU build it depends on the CPU: bfloat16 only where the CPU has native bf16 arithmetic
(``avx512_bf16`` or AMX, flag ``amx_bf16``), otherwise float32. Without those instructions
PyTorch emulates bf16: measured on an AVX2-only AMD EPYC, a 16×1024×2816 bf16 matmul took 88 ms
against 3.3 ms in float32, the embedded default's k = 3 step at B = 16 took 229 ms against 65 ms,
and the ratio k3/k0 that decides the table changed from 3.2 to 2.3 (docs/engine-facts.md, "CPU
build: the dtype"). A fleet's ``dtype`` (or ``ServerConfig.dtype``) overrides the choice; the
engine identity records the dtype actually used, so profiles from the two kinds of CPU never mix.

``TABLETUNE_CPU_BF16`` (``0`` or ``1``) overrides the detection itself: ``0`` makes an AVX-512
machine decide as an AVX2-only one would (how the float32 path is exercised here), ``1`` the
other way round. Stdlib only: the flags come from ``/proc/cpuinfo``, not from torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tabletune_pipelines.errors import EngineConfigError

GPU_DTYPE = "bfloat16"
"""Default dtype of a GPU launch."""
CPU_BF16_DTYPE = "bfloat16"
"""Default dtype on a CPU with native bf16."""
CPU_FALLBACK_DTYPE = "float32"
"""Default dtype on a CPU without native bf16 (emulated bf16 is 2.5-27x slower there)."""
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags that mean native bf16 arithmetic (either suffices)."""
OVERRIDE_ENV = "TABLETUNE_CPU_BF16"
"""``0``/``1``: decide as if the CPU lacked/had native bf16 (tests, emulating another machine)."""
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypeChoice:
    """The default dtype of a launch and why it was chosen."""

    dtype: str
    """``bfloat16`` or ``float32``."""
    reason: str
    """One line a person can read (printed by setup and ``tabletune run``)."""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (or of the given text); empty if unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose_dtype(device: str, *, flags: frozenset[str] | None = None, override: str | None = None) -> DtypeChoice:
    """The default dtype for ``device`` (``cpu`` or ``gpu``) given the CPU's ``flags`` and the
    ``TABLETUNE_CPU_BF16`` value ``override`` (None: read from the environment and ``/proc``)."""
    if device not in ("cpu", "gpu"):
        raise EngineConfigError(f"device = {device!r} must be 'cpu' or 'gpu' to choose a dtype")
    if device == "gpu":
        return DtypeChoice(GPU_DTYPE, "GPU: bfloat16 is native")
    if override is None:
        override = os.environ.get(OVERRIDE_ENV, "")
    if override not in ("", "0", "1"):
        raise EngineConfigError(f"{OVERRIDE_ENV} = {override!r} must be 0 (no native bf16), 1 (native bf16) or unset")
    if override:
        native = override == "1"
        why = f"{OVERRIDE_ENV}={override} says the CPU {'has' if native else 'has no'} native bf16"
    else:
        have = sorted(set(NATIVE_BF16_FLAGS) & (cpu_flags() if flags is None else flags))
        native = bool(have)
        why = (f"the CPU has native bf16 ({', '.join(have)})" if native
               else f"the CPU has no native bf16 (none of {', '.join(NATIVE_BF16_FLAGS)}); bf16 would be emulated")
    return DtypeChoice(CPU_BF16_DTYPE if native else CPU_FALLBACK_DTYPE, why)


@lru_cache(maxsize=8)
def _cached(device: str, override: str) -> DtypeChoice:
    return choose_dtype(device, override=override)


def default_dtype(device: str) -> str:
    """The dtype a launch on ``device`` (``cpu``/``gpu``) uses when none is set (cached per override)."""
    return _cached(device, os.environ.get(OVERRIDE_ENV, "")).dtype


def default_dtype_choice(device: str) -> DtypeChoice:
    """``default_dtype`` with its reason."""
    return _cached(device, os.environ.get(OVERRIDE_ENV, ""))


if __name__ == "__main__":  # `python -m tabletune_pipelines.engine.dtype`: what setup prints
    from tabletune_pipelines.engine.installed import resolve_device

    dev = resolve_device("auto")
    c = default_dtype_choice(dev)
    print(f"model dtype on this machine ({dev}): {c.dtype} ({c.reason}); a fleet's `dtype` overrides it")
