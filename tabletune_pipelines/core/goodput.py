"""Goodput G(B, k) = B * tau(k) / T(B, k) and its inputs (docs/method.md, "Goodput")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidStepTimeError, InvalidValueError
from tabletune_pipelines.vocab import MAX_STEP_MS

# Survival rates may come from counters whose rounding makes a later position a hair
# higher than an earlier one; anything beyond this is a real monotonicity violation.
_MONOTONE_SLACK = 1e-9


def validate_acceptance(rates: Sequence[float] | np.ndarray, *, name: str = "acceptance rates") -> np.ndarray:
    """Check per-position survival rates a_1..a_K and return them as a float array.

    ``a_i`` is the probability that the first i drafts are *all* accepted, so each rate lies in
    [0, 1] and the sequence is non-increasing in i.
    """
    try:
        arr = np.asarray(list(rates), dtype=float)
    except (TypeError, ValueError):
        raise InvalidAcceptanceError(f"{name} must be numbers, got {rates!r}") from None
    if arr.ndim != 1:
        raise InvalidAcceptanceError(f"{name} must be a flat list of numbers, got shape {arr.shape}")
    for i, a in enumerate(arr.tolist(), start=1):
        if not math.isfinite(a) or a < 0.0 or a > 1.0:
            raise InvalidAcceptanceError(
                f"{name}: a_{i} = {a!r} is outside [0, 1]; rates are probabilities that the "
                f"first {i} drafts are all accepted"
            )
    for i in range(1, len(arr)):
        if arr[i] > arr[i - 1] + _MONOTONE_SLACK:
            raise InvalidAcceptanceError(
                f"{name}: a_{i + 1} = {float(arr[i])!r} is larger than a_{i} = {float(arr[i - 1])!r}; survival "
                "rates must be non-increasing with position (use per-position drafted counts, "
                "not total drafts, as the denominator)"
            )
    return arr


def tau(rates: Sequence[float], k: int) -> float:
    """Mean tokens kept per request per step with k drafts: 1 + sum_{i<=k} a_i."""
    arr = validate_acceptance(rates)
    if k < 0 or k > len(arr):
        raise InvalidAcceptanceError(f"k = {k!r} is outside 0..{len(arr)} (the number of known acceptance rates)")
    return 1.0 + float(arr[:k].sum())


def tau_curve(rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """tau(k) for k = 0..K as one array (index k)."""
    arr = validate_acceptance(rates)
    return np.concatenate([[1.0], 1.0 + np.cumsum(arr)])


def validate_step_time(step_ms: float, *, where: str = "") -> float:
    """A step time must be a finite, positive number of milliseconds, at most ``MAX_STEP_MS``."""
    try:
        value = float(step_ms)
    except (TypeError, ValueError, OverflowError):
        raise InvalidStepTimeError(f"step time {step_ms!r:.40}{where} is not a number") from None
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidStepTimeError(
            f"step time {step_ms!r} ms{where} must be finite and positive; re-measure this cell"
        )
    if value > MAX_STEP_MS:
        raise InvalidStepTimeError(
            f"step time {value!r} ms{where} is longer than {MAX_STEP_MS:g} ms, which no decode step takes; "
            "re-measure this cell"
        )
    return value


def goodput(batch_size: int, k: int, step_ms: float, rates: Sequence[float]) -> float:
    """Tokens kept per second at batch size B with k drafts: B * tau(k) / T(B, k)."""
    if batch_size < 1:
        raise InvalidValueError(f"batch size {batch_size!r} must be >= 1")
    t = validate_step_time(step_ms, where=f" at B={batch_size}, k={k}")
    return batch_size * tau(rates, k) / (t / 1000.0)
