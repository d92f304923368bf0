"""Shared test helpers: fleet files, prompt logs, resources, a scripted engine, a /version HTTP server."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from dagster_duckdb import DuckDBResource
from pydantic import PrivateAttr

from tabletune_pipelines.deployments import identity_for
from tabletune_pipelines.documents import AcceptancePrior, StepTimeCell
from tabletune_pipelines.engine.errors import EngineCrashedError
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningPolicy
from tabletune_pipelines.prompts import count_prompts
from tests.tuning.samples import RATES, scripted_ms

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
        "policy": TuningPolicy(**policy),
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
        existing = {(c.k, c.batch_size, c.acceptance) for c in store.profile_cells(identity.key)}
        written = 0
        for b in self.batch_sizes:
            for k in [*range(identity.max_k + 1), None]:
                if (k, b, "reject") in existing:
                    continue
                if 0 <= self.fail_after_cells <= written:
                    raise EngineCrashedError(f"scripted crash: the vLLM server died at B={b}, k={k}",
                                             log_tail="EngineDeadError: scripted")
                ms = scripted_ms(k, b)
                store.write_profile_cell(identity, StepTimeCell(
                    k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms * 0.99, ms, ms * 1.02),
                    launch_k=None if k is None else identity.max_k, timing="engine"))
                written += 1
        return store.load_profile(identity.key)

    def verify_served(self, identity, dep, table, prior, log):
        """Scripted windows (goodput B·τ(k)/T(B, k) of the scripted profile at B = load, 3 rounds, ±1% per
        round alike for every policy) judged by the real ``evaluation.served.judge``."""
        from tabletune_pipelines.core.goodput import tau_curve
        from tabletune_pipelines.core.table import expand_table
        from tabletune_pipelines.evaluation import served

        opts = self.served_verification_options()
        self._calls.append(("verify_served", identity.key, table.table_id))
        K, M = identity.max_k, identity.max_num_seqs
        loads = tuple(opts.loads or served.default_loads(M))
        taus = tau_curve(tuple(self.rates[:K]))
        lookup = expand_table([list(r) for r in table.ranges], M, K)

        def window(policy, k, load, r):
            g = 1000.0 * load * taus[k] / scripted_ms(k, load) * (1.0 + 0.01 * ((r + load) % 3 - 1))
            return served.Window(policy, load, r, int(round(g * 2.0)), 2.0, 100, float(load), 0)

        windows = []
        for load in loads:
            for r in range(3):
                windows += [window(served.fixed_name(k), k, load, r) for k in range(K + 1)]
                windows.append(window(served.CANDIDATE, lookup[load - 1], load, r))
        goodput, verdicts = served.judge(windows, loads, [served.fixed_name(k) for k in range(K + 1)],
                                         tolerance=opts.tolerance)
        plan = served.VerificationPlan(loads, 3, 2.0, 0.0, 0.0, opts.budget_s or 75.0, 0.0)
        return served.ServedVerification(
            candidate=tuple(tuple(r) for r in table.ranges), max_k=K, max_num_seqs=M, plan=plan, goodput=tuple(goodput),
            verdicts=tuple(verdicts), tolerance=opts.tolerance, elapsed_s=0.0, budget_cut=False,
            windows=tuple(windows), device="scripted", acceptance="scripted")

    def measure_acceptance(self, identity, dep, prompts_file, week, log):
        if dep.name in self.fail_acceptance_for:
            raise EngineCrashedError(f"scripted crash while measuring acceptance of {dep.name}")
        n = count_prompts(prompts_file)
        drafts = 100 * n
        rates = tuple(self.rates[: identity.max_k])
        drafted = tuple([drafts] * identity.max_k)
        return AcceptancePrior(
            rates=rates, num_drafts=drafts, drafted_per_pos=drafted,
            accepted_per_pos=tuple(int(round(r * drafts)) for r in rates),
            prompt_fingerprint=hashlib.sha256(prompts_file.read_bytes()).hexdigest(), prompt_count=n,
            week=week, deployment=dep.name, source="measured",
        )


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
