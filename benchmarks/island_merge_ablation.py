"""The island merge's two conditions, one at a time, in the replay simulator (docs/controller.md,
"The control loop"):

    python benchmarks/island_merge_ablation.py                       # H200 MoE profile, load 4, 6 seeds (~1 min)
    python benchmarks/island_merge_ablation.py --surface H200-qwen3-4b --loads 4,64,128 --seeds 3

The production controller hands ``core.evidence.search_with_evidence`` its served steps per batch
size (``visits``). Three variants of that one argument, everything else the same controller:

- ``point test only``: ``visits`` None, so a narrow island is judged on point estimates like any
  narrow range (in production, the setting ``merge_islands: false``);
- ``evidence bound only``: ``visits`` all zero, so the traffic condition holds trivially (0 <= 0) and
  an island merges wherever the evidence does not hold it;
- ``both (production)``: the controller's own counts.

Printed per load: the loss against the best fixed k (the best fixed k measured at seed 0, as in
``evaluate.py``) at each seed, its mean and standard error, and the k the controller ran at seed 0.
Seeded, so a rerun prints the same numbers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

# A sibling script (python puts the script's own folder first on the path): the simulator sections' setup.
import evaluate as ev
from tabletune_pipelines.controller import logic
from tabletune_pipelines.evaluation import simulator as sim

VARIANTS = ("point test only", "evidence bound only", "both (production)")


def _search_with(variant: str):
    """``search_with_evidence`` with its ``visits`` replaced as ``variant`` says."""
    search = logic.search_with_evidence

    def wrapped(*args, visits=None, **kw):
        if variant == "point test only":
            visits = None
        elif variant == "evidence bound only" and visits is not None:
            visits = np.zeros_like(visits)
        return search(*args, visits=visits, **kw)

    return search, wrapped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--surface", default="H200-qwen3-30b-a3b", help="a surface name of evaluate.py (prefix)")
    ap.add_argument("--loads", default="4")
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args(argv)
    found = [s for s in ev.surfaces(False) if s.name.startswith(args.surface)]
    if not found:
        names = [s.name for s in ev.surfaces(False)]
        print(f"no surface named {args.surface!r}; one of {names}", file=sys.stderr)
        return 2
    surf = found[0]
    loads = [int(x) for x in args.loads.split(",") if x]
    st = ev.setup(surf, Path(tempfile.mkdtemp(prefix="island-ablation-")), loads)
    n, K = surf.max_num_seqs, surf.max_k
    for load in st.loads:
        steps = ev.steps_for(load, False)
        best = max(sim.simulate(surf, sim.TablePolicy.fixed(k, n), load, steps, sim.Workload(ev.RATES), seed=load,
                                warmup=200).goodput for k in range(K + 1))
        for variant in VARIANTS:
            original, wrapped = _search_with(variant)
            logic.search_with_evidence = wrapped
            try:
                runs = [sim.simulate(surf, sim.ControllerFactory(st.published, n, K)(), load, steps,
                                     sim.Workload(ev.RATES), seed=seed + load, warmup=200) for seed in range(args.seeds)]
            finally:
                logic.search_with_evidence = original
            loss = np.array([100 * (1 - r.goodput / best) for r in runs])
            se = loss.std(ddof=1) / np.sqrt(loss.size) if loss.size > 1 else float("nan")
            ks = np.bincount(runs[0].ks[200:], minlength=K + 1).tolist()
            print(f"{surf.name} load {load:>3} {variant:<20} loss % per seed {np.round(loss, 1).tolist()}; "
                  f"mean {loss.mean():.2f} ± {se:.2f}; steps at k = 0..{K} (seed 0) {ks}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
