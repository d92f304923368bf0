"""Busy-wait switch for vLLM's shared-memory queue (benchmarks/served_vs_profiled.py).

Put this folder first on ``PYTHONPATH`` of a vLLM server and set ``TABLETUNE_BUSYWAIT_FLAG`` to a
file path: when ``vllm.distributed.device_communicators.shm_broadcast`` is imported, its
module-level ``sched_yield`` (called in the reader's busy loop) is rebound to a function that
sleeps 50 µs while the flag file exists and calls the original otherwise (the flag is re-checked
every 2000 calls, a few ms). This is the rebinding a general plugin would do (docs/engine-facts.md,
"Noise on 2 cores"); the switch lets one launch measure it on and off.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

_TARGET = "vllm.distributed.device_communicators.shm_broadcast"
_FLAG = os.environ.get("TABLETUNE_BUSYWAIT_FLAG")
_SLEEP_S = float(os.environ.get("TABLETUNE_BUSYWAIT_SLEEP_US", "50")) * 1e-6


def _patch(module):
    original = module.sched_yield
    state = {"n": 0, "on": False}

    def sched_yield():
        state["n"] += 1
        if state["n"] % 2000 == 1:
            state["on"] = os.path.exists(_FLAG)
        if state["on"]:
            time.sleep(_SLEEP_S)
        else:
            original()

    module.sched_yield = sched_yield
    sys.stderr.write(f"[tabletune busy-wait] shm_broadcast.sched_yield switchable (flag {_FLAG}) in pid "
                     f"{os.getpid()}\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                _patch(module)
            except Exception as exc:  # never break the server
                sys.stderr.write(f"[tabletune busy-wait] not patched: {exc!r}\n")

        spec.loader.exec_module = exec_and_patch
        return spec


if _FLAG:
    sys.meta_path.insert(0, _Finder())
