"""What serving a (batch size x context) table adds to the controller's per-step path, against a decode step.

    python benchmarks/controller_context_overhead.py
    python benchmarks/controller_context_overhead.py --batch 16,64,256 --rounds 15 --steps 2000

In process (no vLLM), side by side in one run: three controllers of max_num_seqs 1024, K = 3, one on
a batch-only published table, one on a (batch size x context) table of 4 batch-size ranges by 4
context buckets served as published, and one on the same grid with its ``context_columns``, each
bucket's column corrected (``controller/columns.py``: its lookup comes from the column's table in
force with hysteresis). Per batch size B and aggregate (mean, median, max): the per-step cost of choosing
the lookup, i.e. what the scheduler hook does before ``Scheduler.schedule``: reading the running
requests' ``num_computed_tokens`` (``controller.step.running_context``, here on B stand-in
requests) and ``next_lookup``. Each round times ``--steps`` calls of each arm, alternating which
arm goes first; the figure is the mean over rounds of the per-call µs, with its standard error, and
the paired difference grid − batch-only. It is compared with decode steps of the same engines: the
CPU build's tiny-model step (3.0-12.8 ms at B = 1-16, 10 ms taken as the reference; docs/engine-facts.md,
"CPU build") and the H200 steps of vLLM
0.26 (4.7 ms at B = 1 to 10.5 ms at B = 128 with EAGLE-3, docs/engine-facts.md): the target is
well under 1% of a step.

Then the rebuilds (every ``rebuild_every_steps`` steps, off the per-step path): a controlling
batch-only controller against the corrected grid (one evidence search per bucket), ``--rebuilds``
calls each, alternating, in ms with their standard error, against the default ``rebuild_budget_ms``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.controller.step import running_context
from tabletune_pipelines.evaluation.simulator import fake_controller
from tabletune_pipelines.evaluation.synthetic import IDENTITY, linear_profile, publish
from tabletune_pipelines.formats.context_columns import ContextColumn
from tabletune_pipelines.formats.controller_settings import ControllerSettings

N, K = 1024, 3
logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
ROWS = [(1, 16), (17, 64), (65, 256), (257, N)]
BUCKETS = [(1, 512), (513, 2048), (2049, 8192), (8193, 32768)]
GRID = [(b0, b1, c0, c1, (i + j) % (K + 1)) for i, (b0, b1) in enumerate(ROWS) for j, (c0, c1) in enumerate(BUCKETS)]
H200_STEP_MS = (4.7, 10.5)
CPU_STEP_MS = 10.0
DEFAULT_BUDGET_MS = ControllerSettings().rebuild_budget_ms


def controllers(folder: Path, agg: str):
    eng = EngineFacts(max_k=K, max_num_seqs=N, launch_ranges=((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, N, 3)),
                      model=IDENTITY["model"], method=IDENTITY["method"], drafter=IDENTITY["drafter"],
                      vllm_version=IDENTITY["vllm_version"], gpu=IDENTITY["gpu"])
    ident = dict(IDENTITY, max_num_seqs=N)
    clock = [0.0]
    plain = publish(folder / f"plain-{agg}.json", ranges=[(1, N, 2)], rates=(0.7, 0.5, 0.3), n=N, identity=ident,
                    allowed_k=[0, 1, 2, 3], controller={"mode": "observe"})
    grid = publish(folder / f"grid-{agg}.json", ranges=[(1, N, 2)], rates=(0.7, 0.5, 0.3), n=N, identity=ident,
                   allowed_k=[0, 1, 2, 3], context_entries=GRID, ctx_agg=None if agg == "mean" else agg)
    cols = [ContextColumn(ctx=b, level=b[0] + 1, step_ms=linear_profile(N, K), acceptance_rates=(0.7, 0.5, 0.3),
                          pooled=False).to_dict() for b in BUCKETS]
    corrected = publish(folder / f"corrected-{agg}.json", ranges=[(1, N, 2)], rates=(0.7, 0.5, 0.3), n=N,
                        identity=ident, allowed_k=[0, 1, 2, 3], context_entries=GRID,
                        ctx_agg=None if agg == "mean" else agg, context_columns=cols,
                        controller={"rebuild_budget_ms": DEFAULT_BUDGET_MS})
    control = publish(folder / f"control-{agg}.json", ranges=[(1, N, 2)], rates=(0.7, 0.5, 0.3), n=N, identity=ident,
                      allowed_k=[0, 1, 2, 3], controller={"rebuild_budget_ms": DEFAULT_BUDGET_MS})
    return {name: fake_controller(path, clock, engine=eng) for name, path in
            (("plain", plain), ("grid", grid), ("corrected", corrected), ("control", control))}


def per_call_us(ctl, sched, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        ctl.next_lookup(running_context(sched) if ctl.grid.lookups is not None else None)
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="8,64,256,1024")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rebuilds", type=int, default=30)
    a = ap.parse_args()
    print(f"[context-overhead] load average {os.getloadavg()[0]:.2f}; {a.rounds} rounds x {a.steps} calls per arm")

    def ms(xs):
        return statistics.mean(xs), statistics.stdev(xs) / len(xs) ** 0.5

    with tempfile.TemporaryDirectory() as tmp:
        for agg in ("mean", "median", "max"):
            ctl = controllers(Path(tmp), agg)
            assert ctl["grid"].grid.lookups is not None and ctl["plain"].grid.lookups is None
            assert ctl["corrected"].grid.cols is not None and ctl["grid"].grid.cols is None
            for b in (int(x) for x in a.batch.split(",")):
                sched = SimpleNamespace(running=[SimpleNamespace(num_computed_tokens=100 + 37 * i) for i in range(b)])
                us: dict[str, list[float]] = {"plain": [], "grid": [], "corrected": []}
                for r in range(a.rounds):
                    for name in (list(us) if r % 2 else list(us)[::-1]):
                        us[name].append(per_call_us(ctl[name], sched, a.steps))
                (p, pse) = ms(us["plain"])
                for arm in ("grid", "corrected"):
                    (g, gse), (d, dse) = ms(us[arm]), ms([x - y for x, y in zip(us[arm], us["plain"], strict=True)])
                    print(f"[context-overhead] {agg:6s} B={b:5d}: {arm:9s} {g:6.2f} ± {gse:.2f} µs, batch-only "
                          f"{p:5.2f} ± {pse:.2f} µs, added {d:6.2f} ± {dse:.2f} µs per step = "
                          f"{d / 10 / CPU_STEP_MS:.4f}% of a {CPU_STEP_MS:g} ms CPU step, "
                          f"{d / 10 / H200_STEP_MS[1]:.4f}% of a {H200_STEP_MS[1]:g} ms H200 step at B = 128 "
                          f"({d / 10 / H200_STEP_MS[0]:.4f}% of {H200_STEP_MS[0]:g} ms at B = 1)")
        rb: dict[str, list[float]] = {"control": [], "corrected": []}
        for r in range(a.rebuilds):
            for name in (list(rb) if r % 2 else list(rb)[::-1]):
                t0 = time.perf_counter()
                ctl[name].rebuild(0.0)
                rb[name].append((time.perf_counter() - t0) * 1000.0)
        (c, cse), (g, gse) = ms(rb["control"]), ms(rb["corrected"])
        print(f"[context-overhead] rebuild at max_num_seqs {N}: batch-only {c:.2f} ± {cse:.2f} ms, corrected grid of "
              f"{len(BUCKETS)} buckets {g:.2f} ± {gse:.2f} ms (default rebuild_budget_ms {DEFAULT_BUDGET_MS:g}; "
              f"skipped rebuilds: batch-only {ctl['control'].counters.skipped_rebuilds}, grid "
              f"{ctl['corrected'].counters.skipped_rebuilds})")

if __name__ == "__main__":
    main()
