"""Shared test helpers: fleet files, prompt logs, resources, a scripted engine, a /version HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from dagster_duckdb import DuckDBResource
from pydantic import PrivateAttr

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import EngineCrashedError
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningSettings
from tests.tuning.samples import RATES, scripted_ms, scripted_prior, scripted_profile, scripted_verification

__all__ = ["RATES", "ScriptedEngine", "VersionServer", "WEEK", "deployment_dict", "make_resources", "scripted_ms",
           "write_fleet", "write_prompts"]

WEEK = "2026-11-16"  # a complete week (Monday) before "now" in these tests


def deployment_dict(name: str = "local-cpu", **over: Any) -> dict[str, Any]:
    d = {
        "name": name, "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": "tiny:small",
        "method": "draft_model", "max_k": 3, "max_num_seqs": 16,
        "logged_prompts": f"prompts/{name}", "published_table": f"published/{name}.json",
        "live_counters": f"live/{name}.jsonl",
    }
    d.update(over)
    return d


def write_fleet(folder: Path, deployments: list[dict[str, Any]], name: str = "fleet.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump({"schema_version": 1, "deployments": deployments}, sort_keys=False))
    return path


def write_prompts(path: Path, n: int = 24, repetitive: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(n):
            text = ("the cat sat on the mat and the cat sat on the mat " * 4 if repetitive
                    else f"prompt number {i} about topic {i * 7 % 13}")
            fh.write(json.dumps({"prompt": text + f" #{i}", "ts": f"{WEEK}T10:00:00Z"}) + "\n")
    return path


def make_resources(home: Path, fleet_path: Path, engine=None, **policy):
    """The four resources on ``home``'s store and ``fleet_path``; ``engine`` defaults to a ScriptedEngine."""
    return {
        "duckdb": DuckDBResource(database=str(home / "tabletune_store.duckdb")),
        "fleet": FleetResource(path=str(fleet_path)),
        "engine": engine if engine is not None else ScriptedEngine(),
        "policy": TuningSettings(**policy),
    }


class ScriptedEngine(EngineResource):
    """The engine adapter with scripted measurements (fast); identity probing stays real for remote
    endpoints. ``fail_after_cells`` >= 0 makes profiling crash after that many cells."""

    vllm_version: str = "0.32.0+cpu"
    rates: list[float] = list(RATES)
    batch_sizes: list[int] = [1, 2, 4, 8, 12, 16]
    fail_after_cells: int = -1
    fail_acceptance_for: list[str] = []
    _calls: list = PrivateAttr(default_factory=list)

    def local_model_path(self, name, drafter=False, dtype=None):
        return f"/models/{name.replace(':', '-')}{'-draft' if drafter else ''}" if name else name

    def current_identity(self, dep):
        if dep.embedded:
            return identity_for(dep, self.vllm_version)
        return super().current_identity(dep)

    def profile(self, identity, dep, store, log):
        return scripted_profile(identity, store, self.batch_sizes, self.fail_after_cells)

    def verify_served(self, identity, dep, table, prior, log):
        """Scripted windows judged by the real ``tuning.served_verdict.judge``
        (``samples.scripted_verification``)."""
        self._calls.append(("verify_served", identity.key, table.table_id))
        return scripted_verification(identity, table, self.rates, self.served_verification_options())

    def measure_acceptance(self, identity, dep, prompts_file, week, log):
        if dep.name in self.fail_acceptance_for:
            raise EngineCrashedError(f"scripted crash while measuring acceptance of {dep.name}")
        return scripted_prior(identity, dep, prompts_file, week, self.rates)


class VersionServer:
    """A stand-in for a remote vLLM's ``GET /version`` (real HTTP on 127.0.0.1)."""

    def __init__(self, version: str = "0.32.0") -> None:
        self.version = version
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path != "/version":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps({"version": outer.version}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> VersionServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
