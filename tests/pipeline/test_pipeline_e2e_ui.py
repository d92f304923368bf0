"""End to end: real dagster-webserver + dagster-daemon on 127.0.0.1, GraphQL lineage, a sensor tick
that launches a run through the run queue, and a headless-Chromium screenshot of published_table's
lineage page (saved to test-artifacts/ at the repository root, or $TABLETUNE_TEST_ARTIFACTS)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.browser import screenshot
from tests.pipeline.helpers import (
    WEEK,
    ScriptedEngine,
    VersionServer,
    deployment_dict,
    make_resources,
    write_fleet,
    write_prompts,
)

pytestmark = pytest.mark.dagster_e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ARTIFACTS = Path(os.environ.get("TABLETUNE_TEST_ARTIFACTS", REPO / "test-artifacts"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gql(port: int, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.loads(resp.read())
    assert "errors" not in out, out
    return out["data"]


def wait_for(fn, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last!r})")


class Procs:
    """Processes started by the test, each in its own process group; stop() ends every group."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.files: list = []

    def start(self, argv: list[str], env: dict, log: Path) -> subprocess.Popen:
        fh = log.open("w")
        self.files.append(fh)
        p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((p, log))
        return p

    def stop(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p, _ in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        for p, _ in self.procs:  # children that outlived their leader (run workers, code servers)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fh in self.files:
            fh.close()

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n" + log.read_text()[-3000:] for _, log in self.procs if log.exists())


ASSET_GRAPH = """{ assetNodes { assetKey { path } dependencyKeys { path } groupName
  partitionDefinition { type } } }"""
RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId status tags { key value } } } } }"""
WORKSPACE = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def seed_local_deployment(dagster_home: Path, tt_home: Path, fleet: Path) -> str:
    """Materialize the local deployment's chain into the e2e instance (scripted engine timings), so the
    UI shows materialized assets and the sensor finds the local identity already profiled."""
    import dagster as dg

    from tabletune_pipelines.tuning.deployments import identity_for
    from tabletune_pipelines.engine.installed import installed_vllm_version
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.definitions import ASSETS
    from tabletune_pipelines.orchestration.partitions import register_identity

    version = installed_vllm_version()
    dep = load_fleet(fleet).deployment("local-cpu")
    key = identity_for(dep, version).key
    write_prompts(dep.prompts_file(WEEK))
    resources = make_resources(tt_home, fleet, engine=ScriptedEngine(vllm_version=version))
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    try:
        with dg.DagsterInstance.get() as inst:
            register_identity(inst, key)
            assert dg.materialize(ASSETS, selection=["acceptance_prior", "live_acceptance_counters"],
                                  resources=resources, instance=inst, partition_key=WEEK).success
            assert dg.materialize(ASSETS, selection=["step_time_profile", "draft_length_table", "published_table"],
                                  resources=resources, instance=inst, partition_key=key).success
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = old
    return key


def test_webserver_daemon_sensor_run_and_lineage_screenshot(tmp_path, monkeypatch):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    tt_home = tmp_path / "tt_home"
    procs = Procs()
    with VersionServer("0.99.0-e2e") as vllm:
        # A remote deployment whose /version names a vLLM this machine does not have: the sensor registers the
        # identity and requests a profile run; the run fails fast and clearly (no engine started here).
        fleet = write_fleet(tmp_path, [deployment_dict("local-cpu"),
                                       deployment_dict("remote-e2e", endpoint=vllm.url, gpu="H100")])
        monkeypatch.setenv("TABLETUNE_HOME", str(tt_home))
        local_key = seed_local_deployment(dagster_home, tt_home, fleet)
        env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "TABLETUNE_HOME": str(tt_home),
               "TABLETUNE_FLEET": str(fleet), "TABLETUNE_SENSOR_INTERVAL_S": "3",
               "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        port = free_port()
        try:
            procs.start([str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
                        env, tmp_path / "webserver.log")
            procs.start([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], env, tmp_path / "daemon.log")

            def loaded():
                entries = gql(port, WORKSPACE)["workspaceOrError"]["locationEntries"]
                assert entries[0]["locationOrLoadError"]["__typename"] != "PythonError", entries
                return entries[0]["loadStatus"] == "LOADED" and entries[0]["locationOrLoadError"]

            wait_for(loaded, 300, "the code location to load")
            gql(port, "mutation { setNuxSeen }")

            nodes = {"/".join(n["assetKey"]["path"]): n for n in gql(port, ASSET_GRAPH)["assetNodes"]}
            deps = {k: {"/".join(d["path"]) for d in n["dependencyKeys"]} for k, n in nodes.items()}
            assert deps["published_table"] == {"draft_length_table"}
            assert deps["draft_length_table"] == {"step_time_profile", "acceptance_prior", "live_acceptance_counters"}
            assert deps["acceptance_prior"] == {"logged_prompts"}
            assert deps["live_acceptance_counters"] == {"controller_live_counters"}
            assert nodes["step_time_profile"]["partitionDefinition"]["type"] == "DYNAMIC"
            assert nodes["acceptance_prior"]["partitionDefinition"]["type"] == "TIME_WINDOW"
            mats = gql(port, """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
                assetMaterializations(limit: 1) { partition metadataEntries { label } } } } }""",
                       {"k": {"path": ["published_table"]}})["assetOrError"]["assetMaterializations"]
            assert mats[0]["partition"] == local_key
            assert {"table", "publications", "speculative_config"} <= {m["label"] for m in mats[0]["metadataEntries"]}

            def sensor_runs():
                res = gql(port, RUNS, {"filter": {"tags": [{"key": "dagster/sensor_name",
                                                             "value": "engine_upgrade_sensor"}]}})
                return res["runsOrError"]["results"]

            runs = wait_for(sensor_runs, 300, "the upgrade sensor to launch a run")
            time.sleep(8)  # a few more ticks: still exactly one run (the local identity is already profiled)
            runs = sensor_runs()
            assert len(runs) == 1
            tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
            assert tags["tabletune/engine"] == "remote-e2e" and "vllm-0.99.0-e2e" in tags["dagster/partition"]

            def finished():
                (run,) = sensor_runs()
                return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

            run = wait_for(finished, 400, "the sensor's run to finish")
            assert run["status"] == "FAILURE"  # EngineMismatchError: this machine has no vLLM 0.99.0-e2e
            logs = gql(port, """query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events {
                __typename ... on MessageEvent { message }
                ... on ExecutionStepFailureEvent { error { message causes { message } } } } } } }""",
                       {"id": run["runId"]})
            messages = json.dumps(logs["logsForRun"]["events"])
            assert "needs vLLM 0.99.0-e2e" in messages

            url = f"http://127.0.0.1:{port}/assets/published_table?view=lineage&lineageScope=upstream&lineageDepth=3"
            screenshot(url, ARTIFACTS / "published_table_lineage.png", tmp_path / "chromium-profile")
        except BaseException:
            print(procs.tails())
            raise
        finally:
            procs.stop()
    for p, _ in procs.procs:
        assert p.poll() is not None
