"""The whole tuning flow in ONE real vLLM launch on the CPU build (tuning.flow.run_flow): the
profile at synthetic rates 0, then the derive, then the served verification on the same server with
the prior's rates switched in at runtime, then the publish. One launch is counted, every step is
timed, the verification reaches a verdict per load or says UNVERIFIED, and the file says which."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

from tabletune_pipelines.engine import process
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.deployments import LocalEngine
from tabletune_pipelines.tuning.flow import run_flow
from tests.pipeline.helpers import deployment_dict, write_fleet
from tests.tuning.samples import prior

pytestmark = pytest.mark.engine


def test_profile_derive_verify_publish_in_one_launch(tmp_path, monkeypatch, caplog):
    home = tmp_path / "home"
    monkeypatch.setenv("TABLETUNE_HOME", str(home))
    fleet = load_fleet(write_fleet(home, [deployment_dict("local-cpu", max_num_seqs=8)]))
    dep = fleet.deployment("local-cpu")
    starts = []
    real_start = process.VLLMServer.start

    def counting_start(self):
        starts.append(self.config.synthetic_acceptance_rates)
        return real_start(self)

    monkeypatch.setattr(process.VLLMServer, "start", counting_start)
    cache = os.environ.get("TABLETUNE_TINY_MODELS") or str(Path(tempfile.gettempdir()) / "tabletune-tiny-models")
    work = tempfile.mkdtemp(prefix="tt-flow-")  # short: vLLM's IPC socket path lives under it (107 bytes)
    engine = LocalEngine(cache_dir=cache, work_dir=work, where="test", profile_options={
        "batch_sizes": [1, 4, 8], "repetitions": 2, "decode_steps": 16, "remeasure_budget_s": 10,
        "include_no_spec": False, "accept_batch_sizes": []},
        served_verification={"acceptance": "prior", "loads": [8], "budget_s": 30, "window_s": 1.5,
                             "first_warmup_s": 1.0})
    store = TableTuneStore(home / "tabletune_store.duckdb")

    def write_prior(identity):
        store.upsert_identity(identity)
        store.write_acceptance_prior(prior(rates=(0.7, 0.5, 0.3), week="2026-11-30"), identity.key)

    log = logging.getLogger("test.flow")
    with caplog.at_level(logging.INFO, logger="test.flow"):
        report = run_flow(store, fleet, dep, engine, log=log, before_derive=write_prior)
    # ONE launch served everything: started once, with every draft rejected for the profile.
    assert starts == [(0.0, 0.0, 0.0)] and report.launches == 1
    assert set(report.seconds) == {"launch", "profile", "derive", "publish", "total"}
    text = caplog.text
    assert "re-measurement stopped per batch size" in text  # each B's stop reason is printed
    assert "[flow] wall time: launch" in text and "[flow] derived table" in text
    # The verification ran on that launch at the prior's rates and reached a verdict, or says it did not.
    pub = report.publication
    figures = pub.gate.figures
    assert figures["acceptance"].startswith("prior [0.7, 0.5, 0.3]") and "launch_s" not in figures
    assert figures["verdict"] in ("verified", "unverified", "failed") and figures["stop_reasons"]
    assert f"[flow] served verification: {figures['verdict'].upper()}" in text
    if figures["verdict"] == "failed":
        assert pub.refusal and not dep.published_table.exists()
    else:
        doc = read_published_table(dep.published_table)
        assert doc["served_verification"]["verdict"] == figures["verdict"]
        assert pub.gate.warning == (figures["verdict"] == "unverified")
        assert [list(r) for r in doc["table"]["ranges"]] == report.table
