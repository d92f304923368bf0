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


# -- correction per context bucket (``controller/columns.py``) -----------------------------------------

ACTUAL = (0.05, 0.0, 0.0)
"""What the server's drafts keep: almost nothing, so every k >= 1 costs more than it brings."""
SPLIT = [(1, 16, 1, 48, 0), (1, 16, 49, 512, 3)]
"""k = 0 at short contexts (its column's prior is the true acceptance: nothing to correct) and k = 3
at long ones (its column's prior promises 0.95, 0.9, 0.85: wrong)."""


def test_each_context_bucket_is_corrected_on_its_own_drafts(controller_rig, controller_server):
    from tabletune_pipelines.evaluation.synthetic import linear_profile
    from tabletune_pipelines.formats.context_columns import ContextColumn

    rig = controller_rig(ACTUAL)
    cols = [ContextColumn(ctx=(1, 48), level=32, step_ms=linear_profile(16, 3), acceptance_rates=ACTUAL,
                          pooled=False).to_dict(),
            ContextColumn(ctx=(49, 512), level=128, step_ms=linear_profile(16, 3), acceptance_rates=(0.95, 0.9, 0.85),
                          pooled=False).to_dict()]
    v = rig.publish(ranges=[(1, 16, 0)], rates=ACTUAL, context_entries=SPLIT, context_columns=cols,
                    controller={"export_every_steps": 20, "rebuild_every_steps": 20, "prior_weight": 50.0,
                                "min_prior_weight": 1.0, "hysteresis": 0, "exploration_every_steps": 10})

    def state():
        ws = [w for w in rig.windows() if w.table_version == v and w.controller]
        return ws[-1].controller if ws else None

    def long_lowered() -> bool:
        st = state()
        return bool(st and any(k < 3 for _, _, k in st["columns"][1]["table"]))

    serve_until(rig, 7, long_lowered, max_steps=3000)
    st = state()
    assert st is not None and st["mode"] == "control" and st["context_served"], st
    short, long = st["columns"]
    print(f"\n[corrected per bucket] short {short['table']} rates {short['rates']}; long {long['table']} rates "
          f"{long['rates']} (live drafted {long['live_drafted']})")
    # the long bucket's drafts (its own steps and the exploration runs at its contexts) taught its column
    # that k = 3 does not pay: counted in the short column, they would have left its 0.95 prior alone.
    # The short column drafted only in exploration runs; its prior was right, and k = 0 stays where it
    # served (its step-time noise may move a k now and then: its flap bounds are its own)
    assert any(k < 3 for _, _, k in long["table"]) and long["rates"][0] < 0.5 and long["switches"] >= 1
    assert short["rates"][0] < 0.5 and sum(hi - lo + 1 for lo, hi, k in short["table"] if k == 0) >= 8, short
    assert st["context_table"] != [list(e) for e in SPLIT] and st["errors"] == 0
    # and vLLM ran the corrected k: steps of the long bucket at k < 3 after the change (a difference of
    # the cumulative series: the module's other test served this bucket too)

    def long_steps_below_3() -> float:
        return sum(val for n, lab, val in scrape(controller_server) if n == "tabletune_steps_total"
                   and lab["context"] == "49-512" and lab["k"] in ("0", "1", "2"))

    before = long_steps_below_3()
    serve(rig, 7, 200)
    assert long_steps_below_3() > before
