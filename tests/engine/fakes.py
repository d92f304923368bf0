"""A stand-in for ``VLLMServer`` that answers like the timing scheduler would, with fixed step times.

It fakes nothing about vLLM or a GPU: it only lets the profiler's bookkeeping (launches, k
switching, warm-up, resume, cell assembly) run without an engine. Its step time for (k, B) is
``4 + k + B / 10`` ms (no speculation: ``4 + B / 10``).
"""

from __future__ import annotations

from typing import Any


def step_ms(k: int | None, b: int) -> float:
    return 4.0 + (k or 0) + b / 10


class FakeServer:
    """Records what the profiler asks; every batch is admitted in one step."""

    def __init__(self, config: Any, *, launched: list | None = None, device: str = "cpu") -> None:
        self.config = config
        self.device = device
        self.startup_seconds = 0.0
        self.log_path = "fake.log"
        self.calls: list[tuple[str, Any]] = []
        self.k: int | None = None
        """The k set at runtime (None: the launch table's, else K)."""
        self.alive = False
        self._b = 1
        if launched is not None:
            launched.append(self)

    # lifecycle
    def start(self) -> "FakeServer":
        self.alive = True
        return self

    def stop(self) -> None:
        self.alive = False
        self.calls.append(("stop", None))

    def is_alive(self) -> bool:
        return self.alive

    def log_tail(self, lines: int = 40) -> str:
        return ""

    # control
    @property
    def can_switch_synthetic_rates(self) -> bool:
        return self.device == "cpu" and self.config.synthetic_acceptance_rates is not None

    def set_synthetic_rates(self, rates: Any) -> None:
        self.calls.append(("rates", tuple(rates)))

    def set_k(self, k: int | None = None, **kw: Any) -> None:
        if self.config.table is None:
            raise AssertionError("set_k on a launch without a table")
        self.k = k
        self.calls.append(("set_k", k))

    def arm_gate(self, n: int) -> None:
        self.calls.append(("gate", n))

    # requests
    def complete(self, prompts: Any, *, max_tokens: int, **kw: Any) -> dict[str, Any]:
        self._b = len(prompts)
        self.calls.append(("complete", (self._b, max_tokens, self.k_at(self._b))))
        return {"choices": [{}] * self._b}

    def step_log_offset(self) -> int:
        return 0

    def read_steps(self, since: Any = None, until: Any = None, offset: int = 0) -> list[dict[str, Any]]:
        b = self._b
        k = self.k_at(b)
        d = b * (k or 0)
        return [{"b": b, "new": b, "dt": 30.0, "d": 0, "k": k}] + [
            {"b": b, "new": 0, "dt": step_ms(k, b), "d": d, "k": k} for _ in range(20)]

    def k_at(self, b: int) -> int | None:
        """The k the engine drafts at batch size ``b``."""
        if self.config.method is None:
            return None
        if self.k is not None:
            return self.k
        for start, end, k in self.config.table or ():
            if start <= b <= end:
                return k
        return self.config.num_speculative_tokens

    def completes(self) -> list[tuple[int, int, Any]]:
        """(B, max_tokens, k) of every completion request."""
        return [c[1] for c in self.calls if c[0] == "complete"]
