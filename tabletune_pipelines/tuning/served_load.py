"""The closed-loop load of a served measurement: the client threads (``LoadGenerator``) and the order
in which a round serves its policies (``rotated``).

**Load**: ``L`` client threads in a closed loop, each sending one request at a time (``prompt(rng)``
or ``prompt_tokens`` random token ids) with ``max_tokens`` drawn uniformly from ``output_tokens``
(so clients do not finish in lockstep) and ``ignore_eos``; or, for a window of fixed work
(``serve_requests``), each client's first n requests of a round's sequence and no more. The one
closed-loop load generator: the
served verification (``tuning.served_verification``), the benchmarks and the engine tests' rig
(``evaluation.rig``) all run it. No Dagster, no vLLM import: ``server`` is anything with
``complete(...)``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadGenerator", "rotated"]


@dataclass
class LoadGenerator:
    """``load`` closed-loop clients against ``server`` until ``stop()`` (threads; each client sends
    one request at a time through ``server.complete``). The one closed-loop load generator: the
    served verification, the benchmarks and the engine tests' rig (``evaluation.rig.closed_loop``)
    all run this one. ``start()`` again after ``stop()`` restarts the clients (same seeds)."""

    server: Any
    load: int
    vocab_size: int
    prompt_tokens: int = 32
    output_tokens: tuple[int, int] = (32, 128)
    seed: int = 0
    prompt: Callable[[random.Random], Any] | None = None
    """Makes each request's prompt from the client's generator; None = ``prompt_tokens`` random ids."""
    first_seed: int | None = None
    """Client i's generator is seeded ``first_seed + i``; None: ``seed * 100_003 + i``."""
    ignore_eos: bool = True
    """False for a real model on real prompts: it stops where it would in service."""
    temperature: float | None = None
    """Sent with each request; None: the server's default."""
    one_choice: bool = False
    """Count a request completed only when its answer has exactly one choice (otherwise an error);
    False: every answer counts (a scripted stand-in server may answer nothing)."""
    request_timeout_s: float = 600.0
    """Per request, and per client on ``stop()``."""
    retry_pause_s: float = 0.5
    """A client pauses this long after a failed request."""
    error_chars: int = 200
    """Each failed request's exception is kept as its repr cut to this many characters."""
    errors: list[str] = field(default_factory=list)
    completed: int = 0
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._epoch: int | None = None

    def reseed(self, epoch: int) -> None:
        """From each client's next request on, draw prompts and lengths from a generator seeded by
        (the client's seed, ``epoch``): windows reseeded with the same epoch serve the same request
        sequence per client, so a paired comparison of policies sees the same requests (common random
        numbers) rather than a new draw of prompts per window."""
        self._epoch = int(epoch)

    def _base(self, i: int) -> int:
        return self.seed * 100_003 + i if self.first_seed is None else self.first_seed + i

    def _client(self, i: int) -> None:
        base = self._base(i)
        rng, epoch = random.Random(base), None
        while not self._stop.is_set():
            if self._epoch != epoch:
                epoch = self._epoch
                rng = random.Random(f"{base}:{epoch}")
            if not self._send(rng):
                time.sleep(self.retry_pause_s)

    def _send(self, rng: random.Random) -> bool:
        """One request drawn from ``rng`` (its prompt, then its length), counted; False when it failed."""
        with self._lock:
            self.sent += 1
        try:
            prompt = (self.prompt(rng) if self.prompt is not None
                      else [rng.randrange(3, self.vocab_size) for _ in range(self.prompt_tokens)])
            kw = {} if self.temperature is None else {"temperature": self.temperature}
            out = self.server.complete(prompt, max_tokens=rng.randint(*self.output_tokens),
                                       ignore_eos=self.ignore_eos, timeout=self.request_timeout_s, **kw)
            ok = not self.one_choice or len(out.get("choices", [])) == 1
            with self._lock:
                self.completed += int(ok)
                if not ok:
                    self.errors.append(f"answer without a choice: {str(out)[:200]}")
            return ok
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            with self._lock:
                self.errors.append(repr(exc)[:self.error_chars])
            return False

    def serve_requests(self, epoch: int, requests: int) -> int:
        """Fixed work instead of a running loop: ``load`` clients, each sending the first ``requests``
        requests of its sequence for ``epoch`` (the one ``reseed(epoch)`` gives) one after another,
        until all are answered; returns how many were. Two calls with the same epoch serve the same
        requests (prompts and lengths per client), so two policies measured this way differ only in
        how long the same work took. Call it while the loop is stopped."""
        done = [0] * self.load

        def client(i: int) -> None:
            rng = random.Random(f"{self._base(i)}:{int(epoch)}")
            done[i] = sum(self._send(rng) for _ in range(int(requests)))

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(self.load)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=self.request_timeout_s * max(1, int(requests)))
        return sum(done)

    def start(self) -> LoadGenerator:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.load)]
        for t in self._threads:
            t.start()
        return self

    def wait_completed(self, more: int, timeout: float = 180.0) -> int:
        """Block until ``more`` further requests completed (progress, not seconds: a machine 3x slower
        takes 3x longer); ``timeout`` only bounds a stalled engine. Returns the count reached."""
        target = self.completed + more
        deadline = time.monotonic() + timeout
        while self.completed < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.completed} of {target} requests completed after {timeout} s: the engine "
                                     f"stalled (errors: {self.errors[:3]})")
            time.sleep(0.1)
        return self.completed

    def stop(self, wait: bool = True) -> None:
        """Stop sending. ``wait``: until every client's request in flight has finished (so the next
        load starts from an empty engine); without, the clients end on their own (daemon threads)."""
        self._stop.set()
        if wait:
            for t in self._threads:
                t.join(timeout=self.request_timeout_s)

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rotated(names: Sequence[Any], r: int) -> list[Any]:
    """Round ``r``'s order: a balanced Latin square (Williams), so that slow drift hits every policy
    alike (each takes each position once per n rounds) and so does what a window carries over from
    the one before it: every policy follows every other equally often (once per n rounds for an
    even n; twice per 2n for an odd n, whose second n rounds run the first n backwards). A plain
    rotation (A B C, B C A, ...) puts the same predecessor before a policy in every round: on the
    H200 a k = 3 window served ~10 % less after a k = 1 window than after a k = 2 one, so a table
    that follows the docs' table in every round looked ~12 % worse than the identical fixed k
    (docs/engine-facts.md, "A window carries over")."""
    n = len(names)
    if n < 2:
        return list(names)
    seq, lo, hi = [0], 1, n - 1
    while len(seq) < n:  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
        seq.append(lo)
        lo += 1
        if len(seq) < n:
            seq.append(hi)
            hi -= 1
    period = n if n % 2 == 0 else 2 * n
    r %= period
    order = [names[(x + r) % n] for x in seq]
    return order[::-1] if r >= n else order
