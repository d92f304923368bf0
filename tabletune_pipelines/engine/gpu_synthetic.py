"""Synthetic acceptance rates switched at runtime on a GPU (vLLM's own rejection sampler).

On a GPU, vLLM's rejection sampler keeps the synthetic conditional rates of
``rejection_sample_method: "synthetic"`` in one small device tensor
(``RejectionSampler.synthetic_conditional_rates``, Model Runner V2 and V1 alike), made once from
the launch's ``synthetic_acceptance_rates``. ``install()`` wraps the sampler's entry point so
that, before each verification, it polls the synthetic-rates channel (``TABLETUNE_SYNTHETIC_CONTROL``,
``control_protocol.py``, the channel the CPU plugin reads) and copies a new command's conditional
rates into that tensor in place (same address, so nothing captured around it goes stale), then
acknowledges with the rates. One launch can then time "all rejected" cells at rates 0 and serve
the verification at a prior's rates.

It runs in the engine-core process: the timing scheduler (``engine/timing_scheduler.py``) calls
``install()`` there, and on one GPU vLLM runs its worker in that process (``UniProcExecutor``). Where
the worker runs elsewhere the wrap never sees a verification, the command is never acknowledged,
and the writer (``RuntimeControl.set_synthetic_rates``) raises after its timeout: the switch fails
loudly, never silently. A command that fails the check is refused with the reason; the rates in
force stay. Nothing here raises into the engine: a failing poll leaves the step as it was.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tabletune_pipelines.engine.cpu_plugin import conditional_rates
from tabletune_pipelines.errors import InvalidCommand
from tabletune_pipelines.formats.control_protocol import SYNTHETIC_CONTROL_ENV, ControlReader, check_rates_command

logger = logging.getLogger("tabletune.gpu_synthetic")

#: (module, class, method) of vLLM's rejection samplers whose entry point is wrapped.
SAMPLERS: tuple[tuple[str, str, str], ...] = (
    ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "__call__"),  # Model Runner V2
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler", "forward"),  # V1
)
_FLAG = "_tabletune_rates_switch"
_state: dict[str, Any] = {"channel": None}


def apply_pending(sampler: Any, channel: ControlReader) -> list[float] | None:
    """Apply the channel's newest command to ``sampler.synthetic_conditional_rates`` in place; the
    unconditional rates applied, or None (nothing new, or refused with the reason acknowledged)."""
    cmd = channel.poll()
    if cmd is None:
        return None
    target = getattr(sampler, "synthetic_conditional_rates", None)
    if target is None:
        channel.reject(cmd.seq, "this launch's rejection sampler is not synthetic (rejection_sample_method)")
        return None
    try:
        rates = list(check_rates_command(cmd.body, int(target.numel())))
        import torch

        target.copy_(torch.tensor(conditional_rates(rates), dtype=target.dtype))
    except InvalidCommand as exc:
        channel.reject(cmd.seq, str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - never raise into the engine; the writer learns why
        channel.reject(cmd.seq, repr(exc))
        return None
    channel.ack(cmd.seq, rates=rates)
    return rates


def _wrap(original):
    def entry(self, *args, **kwargs):
        channel = _state["channel"]
        if channel is not None:
            try:
                apply_pending(self, channel)
            except Exception as exc:  # noqa: BLE001
                logger.warning("TableTune GPU rates switch: poll failed (%r); the rates in force stay", exc)
        return original(self, *args, **kwargs)

    functools.update_wrapper(entry, original)  # its name, and __wrapped__ = original
    setattr(entry, _FLAG, True)
    return entry


def install() -> list[str]:
    """Wrap every importable rejection sampler of ``SAMPLERS`` (once) when the synthetic-rates
    channel is configured; the classes wrapped. Never raises."""
    channel = ControlReader.from_env(SYNTHETIC_CONTROL_ENV)
    if not channel.path:
        return []
    _state["channel"] = channel
    wrapped = []
    for module, cls_name, method in SAMPLERS:
        try:
            import importlib

            cls = getattr(importlib.import_module(module), cls_name)
            original = getattr(cls, method)
            if not getattr(original, _FLAG, False):
                setattr(cls, method, _wrap(original))
            wrapped.append(f"{module}.{cls_name}.{method}")
        except Exception as exc:  # noqa: BLE001 - a vLLM without this sampler: nothing to wrap
            logger.debug("TableTune GPU rates switch: %s.%s not wrapped (%r)", module, cls_name, exc)
    logger.info("TableTune GPU rates switch on %s (channel %s)", wrapped, channel.path)
    return wrapped
