"""The GPU judge's policy set per load group (benchmarks/gpu_served.py): a closed loop of L clients
never runs more than L requests, so a table that runs the served table's k at every B <= L is that
policy at that load and is measured once."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_served.py"


@pytest.fixture(scope="module")
def gs():
    spec = importlib.util.spec_from_file_location("tt_gpu_served", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


POLICIES = {"fixed_k1": [[1, 128, 1]], "fixed_k2": [[1, 128, 2]], "fixed_k3": [[1, 128, 3]],
            "docs": [[1, 64, 3], [65, 128, 1]], "served": [[1, 96, 3], [97, 117, 2], [118, 128, 1]]}


@pytest.mark.parametrize("load, docs_measured", [(1, False), (32, False), (64, False), (65, True), (128, True)])
def test_the_docs_table_is_measured_only_where_it_differs_from_the_served_table(gs, load, docs_measured):
    here, alias = gs.policies_at(POLICIES, load, 128, 3)
    assert ("docs" in here) is docs_measured
    assert alias == ({} if docs_measured else {"docs": "served"})
    assert {"fixed_k1", "fixed_k2", "fixed_k3", "served"} <= set(here)  # the served table is always measured


def test_a_fixed_k_equal_to_the_served_table_is_still_measured_as_its_own_policy(gs):
    # the served table = k3 at every B <= 64: both are measured (their ratio is the launch's A/A control)
    here, _ = gs.policies_at(POLICIES, 64, 128, 3)
    assert here["fixed_k3"] == [[1, 128, 3]] and here["served"] == POLICIES["served"]
