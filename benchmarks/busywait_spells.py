"""The engine core's poll, sched_yield() against a 50 µs sleep, side by side in ONE launch: what a
closed loop is served on a 2-core machine (docs/engine-facts.md, "Spells of one request").

    python benchmarks/busywait_spells.py
    python benchmarks/busywait_spells.py --clients 8 --rounds 6 --window 12

One launch of the small tiny target + 1-layer draft (the engine tests' rig: ``evaluation.rig``,
the controller plugin in observe mode, k = 1 everywhere, synthetic acceptance) with the busy-wait
switch of ``benchmarks/_busywait``: while its flag file exists the engine core's poll sleeps 50 µs,
otherwise it calls ``sched_yield()`` as vLLM ships. ``--clients`` closed-loop clients run all the
time; the setting alternates window by window (``served.rotated`` per round), each window after
``--settle`` s of the new setting (the flag is re-read every 2000 polls, a few ms).

Printed per window: requests completed per second, engine steps per second, and requests per step
from the controller's own exported windows (k = 1: every running request drafts once a step, so
drafts per step is the batch the engine ran; far below the client count is a spell). At the end:
each setting's mean ± standard error and sleep / yield paired per round.

Read the requests per step, not the requests per second: a window's completions lag its batch (a
request finishes seconds after admission), and a yield window that follows a sleep window starts
outside a spell. Two runs gave sleep / yield requests served 1.16 ± 0.13 and 0.94 ± 0.02, and a
batch of 7.8 ± 0.0 against 5.6-5.8 requests per step (``benchmarks/data/cpu/2026-12-04-busywait-spells.log``
and ``2026-12-04-busywait-spells-run2.log``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _busywait import server_env

from tabletune_pipelines.evaluation.bench import loadavg
from tabletune_pipelines.core.stats import mean_se
from tabletune_pipelines.tuning.served_load import rotated

SETTINGS = ("sleep", "yield")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--window", type=float, default=12.0, help="seconds measured per setting and round")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after a switch before measuring")
    args = ap.parse_args()
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.rig import Rig, closed_loop, drafting_requests_per_step, server_config

    rates = (0.6, 0.02, 0.01)
    work = Path(tempfile.mkdtemp(prefix="tt-busywait-"))
    pub, flag = work / "local.json", work / "busywait.on"
    srv = VLLMServer(server_config(work, pub, rates=rates, extra_env=server_env(flag)))
    rig = Rig(srv, pub, work / "local.live.jsonl")
    rig.publish(ranges=[(1, 16, 1)], rates=rates, allowed_k=[1], controller={"mode": "observe"})
    t0 = time.monotonic()
    srv.start()
    print(f"engine started in {time.monotonic() - t0:.0f} s; {args.clients} clients; load average {loadavg()}")
    load = closed_loop(srv, args.clients, max_tokens=(96, 160)).start()
    served: dict[str, list[float]] = {s: [] for s in SETTINGS}
    batch: dict[str, list[float]] = {s: [] for s in SETTINGS}
    try:
        for r in range(args.rounds):
            for setting in rotated(list(SETTINGS), r):
                if setting == "sleep":
                    flag.touch()
                else:
                    flag.unlink(missing_ok=True)
                time.sleep(args.settle)
                start, done0, steps0, m0 = datetime.now(timezone.utc), load.completed, rig.steps(), time.monotonic()
                time.sleep(args.window)
                seconds = time.monotonic() - m0
                rate, step_rate = (load.completed - done0) / seconds, (rig.steps() - steps0) / seconds
                per_step = drafting_requests_per_step([w for w in rig.windows() if w.window_start >= start])
                served[setting].append(rate)
                batch[setting].append(per_step)
                print(f"round {r} {setting:<5} {rate:6.2f} requests/s, {step_rate:6.1f} steps/s, "
                      f"{per_step:4.1f} requests per step  load average {loadavg()}", flush=True)
    finally:
        load.stop()
        srv.stop()
    print(f"\nerrors: {len(load.errors)}")
    for s in SETTINGS:
        m, se = mean_se(served[s])
        b, bse = mean_se(batch[s])
        print(f"{s:<5}: {m:.2f} ± {se:.2f} requests/s, {b:.1f} ± {bse:.1f} requests per step")
    ratio = mean_se([a / b for a, b in zip(served["sleep"], served["yield"]) if b > 0])
    print(f"sleep / yield, requests served (paired per round): {ratio[0]:.2f} ± {ratio[1]:.2f}")
    return 1 if load.errors else 0


if __name__ == "__main__":
    sys.exit(main())
