"""The controller's series on a real vLLM server's /metrics (CPU build), scraped directly and by a real
Prometheus (Debian's ``prometheus`` package), with the deploy/ rules loaded and every query of the
Grafana dashboard run against it; a headless-Chromium screenshot of Prometheus's graph of the k in
force (test-artifacts/, or $TABLETUNE_TEST_ARTIFACTS; docs/img/ holds a copy).

The server is the shared controller server (tests/controller/conftest.py, ``PROMETHEUS_MULTIPROC_DIR``
set); the controller-off check reuses the suite's shared server without the plugin (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletune_pipelines.controller.metrics import batch_cells, cell_label, table_k_per_cell
from tabletune_pipelines.engine.process import free_port
from tabletune_pipelines.evaluation.rig import closed_loop
from tests.browser import screenshot

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TABLETUNE_TEST_ARTIFACTS", REPO / "test-artifacts"))
RULES = REPO / "deploy" / "prometheus" / "tabletune-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "tabletune-controller.json"
SERIES = ("tabletune_table_version", "tabletune_table_source", "tabletune_k", "tabletune_steps_total",
          "tabletune_drafted_tokens_total", "tabletune_accepted_tokens_total", "tabletune_switches_total",
          "tabletune_reversals_total", "tabletune_rebuilds_total", "tabletune_exploration_steps_total",
          "tabletune_refused_files_total", "tabletune_errors_total", "tabletune_step_seconds",
          "tabletune_profile_step_seconds")
RATES = (0.7, 0.5, 0.3)


def scrape(server) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the server's /metrics: (name, labels, value)."""
    with urllib.request.urlopen(server.process.base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def total(samples, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def families(samples, prefix: str) -> dict[str, set[tuple[str, ...]]]:
    """Sample names starting with ``prefix`` and the label names each carries; without the ``_created``
    samples, which ``prometheus_client`` omits in multiprocess mode (the controller's server runs it)."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for n, lab, _ in samples:
        if n.startswith(prefix) and not n.endswith("_created"):
            out.setdefault(n, set()).add(tuple(sorted(lab)))
    return out


def serve(rig, clients: int, steps: int) -> None:
    """``clients`` closed-loop clients until the export shows ``steps`` more controller steps; every
    request in flight finishes before it returns (the engine is idle then)."""
    gen = closed_loop(rig.server, clients, max_tokens=(48, 96)).start()
    try:
        rig.wait_steps(steps)
    finally:
        gen.stop()


def serve_until(rig, clients: int, done, max_steps: int, stall_s: float = 300.0) -> None:
    """``clients`` closed-loop clients until ``done()`` holds or the export shows ``max_steps`` more
    controller steps, whichever comes first: a phase that waits for a change ends when the change is
    seen instead of running out a fixed step count. ``stall_s`` guards a stalled engine only (the
    longest wait with no new step exported)."""
    gen = closed_loop(rig.server, clients, max_tokens=(48, 96)).start()
    try:
        target = rig.steps() + max_steps
        seen, since = rig.steps(), time.monotonic()
        while not done() and (now := rig.steps()) < target:
            if now != seen:
                seen, since = now, time.monotonic()
            assert time.monotonic() - since < stall_s, f"no new step for {stall_s} s:\n{rig.server.log_tail(30)}"
            time.sleep(1.0)
    finally:
        gen.stop()


def test_every_series_is_on_metrics_and_agrees_with_the_export_to_the_token(controller_rig, controller_server):
    rig = controller_rig(RATES)
    # A table of k = 1 everywhere; the controller measures step times (step-time correction on).
    v = rig.publish(ranges=[(1, 16, 1)], rates=RATES, controller={"export_every_steps": 1})
    serve(rig, 4, 150)  # v is installed at the first poll; every later rebuild exports a line
    before, n0 = scrape(controller_server), len(rig.windows())
    assert rig.windows()[-1].table_version == v
    serve(rig, 2, 200)
    serve(rig, 7, 200)
    after, ws = scrape(controller_server), rig.windows()[n0:]
    assert ws and all(w.table_version == v for w in ws)
    names = {n for n, _, _ in after}
    assert set(SERIES) <= names, sorted(set(SERIES) - names)
    for n, lab, _ in after:
        if n.startswith("tabletune_"):
            assert lab.get("model_name") and lab.get("engine") == "0", (n, lab)
    d = {name: total(after, name) - total(before, name) for name in SERIES}
    # the same steps, to the token: every step of the windows written in between, nothing else
    assert d["tabletune_steps_total"] == sum(w.steps for w in ws) > 0
    for i in range(3):
        p = str(i + 1)
        assert (total(after, "tabletune_drafted_tokens_total", position=p)
                - total(before, "tabletune_drafted_tokens_total", position=p)) == sum(w.drafted_per_pos[i] for w in ws)
        assert (total(after, "tabletune_accepted_tokens_total", position=p)
                - total(before, "tabletune_accepted_tokens_total", position=p)) == sum(w.accepted_per_pos[i] for w in ws)
    c0, c1 = rig.windows()[n0 - 1].controller, ws[-1].controller
    assert d["tabletune_rebuilds_total"] == (c1["rebuilds"] + c1["skipped_rebuilds"]) - (c0["rebuilds"] + c0["skipped_rebuilds"])
    assert d["tabletune_exploration_steps_total"] == c1["exploration_steps"] - c0["exploration_steps"] > 0
    assert d["tabletune_errors_total"] == c1["errors"] - c0["errors"]
    assert (total(after, "tabletune_switches_total", reason="evidence")
            - total(before, "tabletune_switches_total", reason="evidence")) == c1["switches"] - c0["switches"]
    assert total(after, "tabletune_table_version") == v
    # the table in force: its source and its k per cell, as the export's controller state says
    source = "published" if c1["table"] == [[1, 16, 1]] else "corrected"
    assert total(after, "tabletune_table_source", source=source) == 1 == total(after, "tabletune_table_source")
    cells = batch_cells(16)
    want = dict(zip((cell_label(*c) for c in cells), table_k_per_cell(c1["table"], cells)))
    assert {lab["batch"]: val for n, lab, val in after if n == "tabletune_k" and lab["context"] == "all"} == want
    # the cells of a context axis not in force read NaN (the series live in files: no removal there)
    assert all(val != val for n, lab, val in after if n == "tabletune_k" and lab["context"] != "all")
    # the cells the load visited (2 and 7 clients; B wanders below them as requests finish)
    cells = {lab["batch"] for n, lab, val in after if n == "tabletune_steps_total" and val > 0}
    assert {"2", "5-8"} <= cells, cells
    assert total(after, "tabletune_step_seconds") > 0 and total(after, "tabletune_profile_step_seconds") > 0


def test_with_the_controller_off_metrics_has_no_tabletune_series_and_vllms_are_the_same(shared_server, controller_server):
    for srv in (shared_server, controller_server):  # both have served (vLLM sets some gauges at its first steps)
        gen = closed_loop(srv, 2, max_tokens=(8, 16)).start()
        time.sleep(3)
        gen.stop()
    off, on = scrape(shared_server), scrape(controller_server)
    assert not [n for n, _, _ in off if n.startswith("tabletune")]
    # vLLM's own series: the same names with the same label names whether the controller runs or not
    f_off, f_on = families(off, "vllm:"), families(on, "vllm:")
    assert f_off == f_on, ({k: v for k, v in f_off.items() if f_on.get(k) != v},
                           {k: v for k, v in f_on.items() if f_off.get(k) != v})
    assert len(f_on) > 40
    assert families(on, "tabletune_")


class Prometheus:
    """A Prometheus server of its own (free port, temp config and storage) scraping ``target`` every
    second, with the rule files ``rules``."""

    def __init__(self, tmp: Path, target: str, rules: list[Path]) -> None:
        exe = shutil.which("prometheus")
        assert exe, "prometheus is not installed: apt-get install -y prometheus (Debian)"
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(r) for r in rules],
            "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [target]}]}]}))
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, **params: str):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out["status"] == "success", out
        return out["data"]

    def query(self, expr: str):
        return self.api("query", query=expr)["result"]

    def wait(self, expr: str, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                res = self.query(expr)
                if res:
                    return res
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(1)
        raise AssertionError(f"no data for {expr!r} in {timeout:.0f} s ({last!r}); log:\n"
                             f"{self.log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Grafana dashboard, with Grafana's variables
    replaced as Grafana would for the test's range (all models, a 1-minute rate window)."""
    d = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"].replace("$__rate_interval", "1m").replace("$model_name", ".*"))
            for p in d["panels"] for t in p["targets"]]


def in_force(prom: Prometheus, version: int, expr: str) -> bool:
    """Whether Prometheus's latest scrape shows ``version`` in force and, at that scrape or a later
    one, ``expr`` true."""
    return bool(prom.query(f"max(tabletune_table_version) == {version}")) and bool(prom.query(expr))


def test_a_real_prometheus_scrapes_it_runs_the_rules_and_every_dashboard_query(controller_rig, controller_server,
                                                                               tmp_path):
    rig = controller_rig(RATES)
    host = controller_server.process.base_url.removeprefix("http://")
    prom = Prometheus(tmp_path, host, [RULES])
    t0 = time.time()
    try:
        prom.wait('up{job="vllm"} == 1')
        # k = 1 everywhere with step times measured, then the same table judged on the published
        # profile alone (no step-time correction), which the prior's evidence moves while Prometheus watches
        rig.publish(ranges=[(1, 16, 1)], rates=RATES)
        serve(rig, 6, 200)
        # Each later phase runs until Prometheus itself has scraped the move it waits for (the k in
        # force up, then down under the next version), at most the steps a fixed phase used to run
        # (500, then 400): the query_range assertion below reads what Prometheus stored, so the phase
        # needs nothing past the first scrape that shows the move.
        up = rig.publish(ranges=[(1, 16, 1)], rates=RATES, controller={"step_time_correction": False})
        serve_until(rig, 6, lambda: in_force(prom, up, "max(tabletune_k) >= 2"), max_steps=500)
        # then the drafts' acceptance drops to (0.2, 0.1, 0.05), and a version with that prior brings k down
        low = (0.2, 0.1, 0.05)
        controller_server.set_synthetic_rates(list(low))
        down = rig.publish(ranges=[(1, 16, 3)], rates=low, controller={"step_time_correction": False})
        serve_until(rig, 6, lambda: in_force(prom, down, "max(tabletune_k) < 3"), max_steps=400)
        for title, expr in dashboard_queries():
            res = prom.wait(expr, timeout=60)
            assert res, (title, expr)
        groups = {g["name"]: g for g in prom.api("rules")["groups"]}
        assert {"tabletune.recording", "tabletune.alerts"} <= set(groups)
        for g in groups.values():
            for r in g["rules"]:
                assert r["health"] == "ok", r
        assert prom.wait("tabletune:acceptance:ratio_rate5m")
        # the k in force over the run: k = 1 at first, more once the controller moved it
        rng = prom.api("query_range", query="max(tabletune_k)", start=str(time.time() - 600), end=str(time.time()),
                       step="1")["result"]
        seen = [float(v) for _, v in rng[0]["values"]]
        assert 1.0 in seen and max(seen) >= 2.0 and seen[-1] < max(seen), seen
        span = int(time.time() - t0) + 10  # the graph spans the run
        url = (f"http://127.0.0.1:{prom.port}/graph?g0.expr={urllib.parse.quote('tabletune_k')}&g0.tab=0"
               f"&g0.stacked=0&g0.show_exemplars=0&g0.range_input={span}s")
        screenshot(url, ARTIFACTS / "prometheus-k-in-force.png", tmp_path / "chromium-profile", size="1400,900")
    finally:
        prom.stop()
