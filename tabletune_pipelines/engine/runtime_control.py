"""``RuntimeControl``: changing a running server's draft length, admission gate and synthetic rates.

The writer side of a launch's two control channels (``control_protocol.ControlWriter``; the
protocol, its files and its acknowledgements are all there): ``set_k`` switches the draft length or
the table and ``arm_gate`` admits the next n requests in one step (the k channel, read by the timing
scheduler once per step); ``set_synthetic_rates`` changes the synthetic acceptance (read when drafts
are verified: by the CPU plugin on the CPU build, by ``engine.gpu_synthetic`` on a GPU). A command
is checked against the launch configuration before it is sent. ``VLLMServer`` opens the channels
when its server has started and hands over its ``complete`` (a tiny request makes an idle engine
take a step) and its log tail (quoted when the engine refuses or does not answer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.errors import ControlProtocolError, EngineConfigError, EngineError, InvalidCommand
from tabletune_pipelines.formats.control_protocol import ControlWriter, check_k_command, check_rates_command
from tabletune_pipelines.vocab import ContextAggregate

#: A one-request "nudge" that makes an idle engine take a step (the timing scheduler reads its
#: control file once per step). Token ids, so no tokenizer vocabulary is assumed.
NUDGE_PROMPT: list[int] = [10, 11, 12, 13]


class RuntimeControl:
    """The k / table / gate and synthetic-rates channels of one launch (no channel before ``open``)."""

    def __init__(self, config: ServerConfig, device: str, *, complete: Callable[..., Any],
                 log_tail: Callable[[int], str]) -> None:
        self.config = config
        """The launch configuration commands are checked against."""
        self.device = device
        """``cpu`` or ``gpu``: on a GPU the synthetic rates switch through the timing scheduler."""
        self.k_channel: ControlWriter | None = None
        """The k / table / gate channel (``control_protocol.K_CONTROL_ENV``); None before ``open``."""
        self.rates_channel: ControlWriter | None = None
        """The synthetic-rates channel (``control_protocol.SYNTHETIC_CONTROL_ENV``); None before ``open``."""
        self._complete = complete
        self._log_tail = log_tail
        self.k_in_force: tuple[tuple[int, ...], ...] | None = (
            tuple((int(lo), int(hi), int(k)) for lo, hi, k in config.table) if config.table else None)
        """The table the k channel last put in force (the launch table until ``set_k``; 5-item entries
        for a (batch size x context) table): the synthetic rates' nudge runs at a batch size where it
        drafts (``nudge_batch``)."""

    def open(self, k_control: Path, synthetic_control: Path) -> None:
        """Write to the channel files of a started launch from now on."""
        self.k_channel = ControlWriter(k_control)
        self.rates_channel = ControlWriter(synthetic_control)

    def set_k(self, k: int | None = None, *, table: Sequence[Sequence[int]] | None = None,
              timeout: float = 30.0, ctx_agg: ContextAggregate | None = None) -> None:
        """Switch the draft length at runtime: every batch size uses ``k`` (or the given ``table``).
        A ``table`` of 5-item entries is a (batch size x context) table: the timing scheduler serves
        each step the column of its running requests' context, aggregated by ``ctx_agg`` (default
        ``mean``; given only with such a table).

        The engine applies it after its next step: call this while it is idle or busy, it waits
        for the acknowledgement (the engine core polls the control file once per step; when idle
        a tiny request nudges it).
        """
        if not self.config.step_timing:
            raise EngineConfigError("runtime k switching needs step_timing=True (TableTune's timing scheduler)")
        if self.config.table is None:
            raise EngineConfigError("runtime k switching needs a launch table (ServerConfig.table)")
        if (k is None) == (table is None):
            raise EngineConfigError("give exactly one of k or table")
        cmd: dict[str, Any] = {}
        if k is not None:
            if not 0 <= k <= (self.config.num_speculative_tokens or 0):
                raise EngineConfigError(
                    f"k = {k!r} is outside 0..num_speculative_tokens = {self.config.num_speculative_tokens}")
            cmd["k"] = int(k)
        elif table is not None:
            cmd["table"] = DraftTable.from_entries([list(r) for r in table], allow_context=True).entries()
        if ctx_agg is not None:
            cmd["ctx_agg"] = ctx_agg
        try:  # the engine's own check of the command, before anything is sent
            check_k_command(cmd, max_k=int(self.config.num_speculative_tokens or 0),
                            max_num_seqs=int(self.config.max_num_seqs))
        except InvalidCommand as exc:
            raise EngineConfigError(f"k control {cmd!r:.200} refused: {exc}") from None
        if self.k_channel is None:
            raise EngineError("the server is not started: start() it before switching k")
        self._request(self.k_channel, cmd, timeout, f"k control {cmd}",
                      poke=lambda: self._complete(NUDGE_PROMPT, max_tokens=1), pause=0.05)
        M = int(self.config.max_num_seqs)
        self.k_in_force = ((1, M, int(k)),) if k is not None else tuple(tuple(r) for r in cmd["table"])

    def nudge_batch(self) -> int:
        """The smallest batch size at which the k in force drafts (k > 0): the synthetic rates are read
        when drafts are verified, so a nudge at a batch size whose k is 0 (``[1, 1, 0]`` opens every
        launch table that lists k = 0) does not make a GPU engine read them. 1 when no table is known
        (a fixed-K launch drafts at every batch size) or when the k in force is 0 everywhere: the CPU
        build reads the rates even in a step without drafts, and elsewhere the switch times out with
        its message."""
        if not self.k_in_force:
            return 1
        K = int(self.config.num_speculative_tokens or 0)
        table = DraftTable.from_entries([list(r) for r in self.k_in_force], allow_context=True)
        dense = table.dense(int(self.config.max_num_seqs), K)  # a nudge's context is its 4 prompt tokens
        ks = dense if dense.ndim == 1 else dense[:, table.axes.context_column(len(NUDGE_PROMPT))]
        return next((b for b, k in enumerate(ks.tolist(), start=1) if k > 0), 1)

    def _nudge_drafting(self, n: int) -> None:
        """``n`` short requests admitted in one step (``arm_gate``), so the engine runs a batch of n
        that drafts and verifies."""
        if n <= 1:
            self._complete(NUDGE_PROMPT, max_tokens=4, ignore_eos=True)
            return
        self.arm_gate(n)
        with ThreadPoolExecutor(max_workers=n) as pool:
            for f in [pool.submit(self._complete, NUDGE_PROMPT, max_tokens=4, ignore_eos=True) for _ in range(n)]:
                f.result()

    @property
    def can_switch_synthetic_rates(self) -> bool:
        """True when synthetic rates can change at runtime: a synthetic launch on the CPU build, or on
        a GPU with TableTune's timing scheduler (``engine.gpu_synthetic``)."""
        return self.config.synthetic_acceptance_rates is not None and (self.device == "cpu" or self.config.step_timing)

    def set_synthetic_rates(self, rates: Sequence[float], timeout: float = 30.0) -> None:
        """Replace the synthetic acceptance rates at runtime (a synthetic launch only)."""
        if not self.can_switch_synthetic_rates or self.rates_channel is None:
            raise EngineConfigError("synthetic rates can be switched only in a launch with "
                                    "synthetic_acceptance_rates set (and, on a GPU, step_timing=True)")
        K = int(self.config.num_speculative_tokens or 0)
        try:  # the engine's own check of the command, before anything is sent
            rates = list(check_rates_command({"rates": [float(r) for r in rates]}, K))
        except (InvalidCommand, TypeError, ValueError) as exc:
            raise EngineConfigError(f"synthetic rates {rates!r:.200} refused: {exc}") from None
        # The rates are read when drafts are verified: short requests at a batch size that drafts make
        # that happen (a launch table opens with [1, 1, 0]: a lone request there never drafts).
        n = self.nudge_batch()
        self._request(self.rates_channel, {"rates": rates}, timeout, f"synthetic rates {rates}",
                      poke=lambda: self._nudge_drafting(n), pause=0.02)

    def arm_gate(self, n: int, timeout: float = 10.0) -> None:
        """Hold the next ``n`` arriving requests in the engine and admit them in one step.

        Used by the profiler right before sending a timed batch of n requests (on 2 cores the
        API server otherwise hands them over across several steps: docs/engine-facts.md, "Noise
        on 2 cores"). Does not wait for an acknowledgement; no-op without the timing scheduler.
        """
        if not self.config.step_timing or self.k_channel is None or n <= 1:
            return
        self.k_channel.send({"gate": int(n), "gate_timeout": float(timeout)})

    def _request(self, channel: ControlWriter, cmd: dict[str, Any], timeout: float, what: str, *,
                 poke: Any, pause: float) -> None:
        try:
            channel.request(cmd, timeout=timeout, poke=poke, pause=pause, what=what)
        except ControlProtocolError as exc:
            raise EngineError(str(exc), self._log_tail(10)) from None
