"""The controller's scheduler serves a 5-item (batch size x context) table on the CPU build's real vLLM
(0.32, which takes only the 3-item form): the k of every step is the cell of that step's batch size
and mean context.

The server is the controller tests' shared one (tests/controller/conftest.py: tiny models, K = 3,
max_num_seqs 16, the launch table listing every k, ``PROMETHEUS_MULTIPROC_DIR`` set). The grid's batch
ranges are unions of the series' batch bins (1, 2 | 3-4 | 5-8, 9-16), so the steps counted per
(batch bin, context bucket, k) on /metrics say, step by step, whether vLLM ran the cell's k: every
step of a cell must have run at that cell's k, and both context buckets must have been served. The
load's requests hold 16 prompt tokens and 48-96 output tokens, so the mean KV length of the running
requests crosses the bucket edge at 48 as they generate.
"""

from __future__ import annotations

import pytest

from tabletune_pipelines.controller.metrics import batch_cells, cell_label
from tests.controller.test_engine_metrics import scrape, serve, serve_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

RATES = (0.7, 0.5, 0.3)
GRID = [(1, 2, 1, 48, 3), (1, 2, 49, 512, 1), (3, 4, 1, 48, 2), (3, 4, 49, 512, 0),
        (5, 16, 1, 48, 1), (5, 16, 49, 512, 3)]
"""k per (batch-size range, context bucket): every k differs from its row's and column's neighbours."""


def cell_k(batch_label: str, context_label: str) -> int:
    lo = int(batch_label.split("-")[0])
    c0 = int(context_label.split("-")[0])
    (k,) = [k for b0, b1, x0, _, k in GRID if b0 <= lo <= b1 and x0 == c0]
    return k


def test_every_step_runs_the_k_of_its_batch_size_and_mean_context(controller_rig, controller_server):
    rig = controller_rig(RATES)
    v = rig.publish(ranges=[(1, 16, 2)], rates=RATES, context_entries=GRID, controller={"export_every_steps": 1})
    # v is installed at the first poll; wait for its own windows, not a step count (the version in
    # force before it, another module's, may export the 40 steps itself when v replaces it)
    serve_until(rig, 2, lambda: any(w.table_version == v and w.controller for w in rig.windows()), max_steps=400)
    ws = [w for w in rig.windows() if w.table_version == v and w.controller]
    assert ws and ws[-1].controller["context_served"] and ws[-1].controller["ctx_agg"] == "mean"
    serve(rig, 3, 250)
    serve(rig, 7, 250)
    samples = scrape(controller_server)
    steps = {(lab["batch"], lab["context"], lab["k"]): val for n, lab, val in samples
             if n == "tabletune_steps_total" and lab["context"] in ("1-48", "49-512") and val > 0}
    wrong = {key: val for key, val in steps.items() if key[2] != str(cell_k(key[0], key[1]))}
    assert not wrong, (wrong, steps)
    print(f"\n[served context] steps per (batch bin, context bucket, k): {sorted(steps.items())}")
    served = {(b, c) for b, c, _ in steps}
    assert {c for _, c in served} == {"1-48", "49-512"}, served
    assert len(served) >= 4 and sum(steps.values()) >= 400, steps
    # the k the series say is in force per cell: the grid's
    ks = {(lab["batch"], lab["context"]): val for n, lab, val in samples
          if n == "tabletune_k" and lab["context"] in ("1-48", "49-512")}
    assert ks == {(cell_label(*b), c): cell_k(cell_label(*b), c) for b in batch_cells(16) for c in ("1-48", "49-512")}
    assert ws[-1].controller["errors"] == 0 == rig.windows()[-1].controller["errors"]
