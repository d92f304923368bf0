"""Step times and goodput per (context level, batch size, k) of a profile, with the best k and its
margin: the figures behind a (batch size x context) table, read straight from the measured cells.

    python benchmarks/context_surface.py PROFILE.json --rates 0.7,0.5,0.3

Each all-rejected cell's median step time ± its standard error, and G = B · τ(k) / T at the given
acceptance (``core.goodput.tau_curve``); per row the best k and how much it leads the next best,
± the lead's standard error from the two cells' standard errors. Where both cells have the same
number of repetitions (one launch measures the k of a batch size in rotating order, one repetition
of each per round), the lead paired by round follows: the mean of the per-round goodput ratios ±
its standard error (``core.stats.paired_ratio``), which takes out the drift both k share.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.stats import paired_ratio
from tabletune_pipelines.core.steptime import median_standard_error
from tabletune_pipelines.formats.documents import StepTimeProfile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--rates", default="0.7,0.5,0.3")
    args = ap.parse_args(argv)
    profile = StepTimeProfile.from_json(Path(args.profile).read_text())
    rates = tuple(float(x) for x in args.rates.split(","))
    tau = tau_curve(rates)
    cells = {(c.context_tokens, c.batch_size, c.k): c for c in profile.cells
             if c.acceptance == "reject" and c.k is not None}
    print(f"{profile.identity.key}; acceptance {rates}")
    for level in sorted({lv for lv, _, _ in cells}):
        print(f"context {level}")
        for b in sorted({bb for lv, bb, _ in cells if lv == level}):
            row, g, rel = [], {}, {}
            for k in sorted({kk for lv, bb, kk in cells if lv == level and bb == b}):
                c = cells[(level, b, k)]
                se = c.stderr_ms if c.stderr_ms is not None else median_standard_error(c.repetitions_ms)
                g[k] = b * tau[k] / c.median_ms * 1000.0
                rel[k] = (se or 0.0) / c.median_ms
                row.append(f"k{k} {c.median_ms:6.2f}±{(se or 0.0):4.2f} ms")
            order = sorted(g, key=lambda k: -g[k])
            lead = ""
            if len(order) > 1:  # the lead's s.e.: the two cells' relative errors, independent
                ratio = g[order[0]] / g[order[1]]
                se_lead = 100 * ratio * math.hypot(rel[order[0]], rel[order[1]])
                lead = f" (+{100 * (ratio - 1):.1f} ± {se_lead:.1f}% over k={order[1]}"
                a, b2 = cells[(level, b, order[0])].repetitions_ms, cells[(level, b, order[1])].repetitions_ms
                if len(a) == len(b2) > 1:  # G ratio per round: tau ratio times T(second) / T(first)
                    t = tau[order[0]] / tau[order[1]]
                    m, se, n = paired_ratio({r: t * y for r, y in enumerate(b2)}, dict(enumerate(a)))
                    lead += f"; paired by round: +{100 * (m - 1):.1f} ± {100 * se:.1f}% over {n} rounds"
                lead += ")"
            print(f"  B={b:3d} " + " | ".join(row) + f"  best k={order[0]}{lead}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
