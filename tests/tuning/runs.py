"""What the run-level library tests share (no Dagster): a plain scripted engine (``deployments.Engine``),
a fleet, a store, a log that keeps what it was told, and the table policy at its defaults."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import EndpointUnreachable, EngineCrashedError
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
from tabletune_pipelines.formats.fleet import Fleet, parse_fleet
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.build import DefaultBuildSettings
from tests.tuning.samples import RATES, scripted_prior, scripted_profile, scripted_verification

WEEK = "2026-11-16"

SETTINGS = DefaultBuildSettings()
"""The knobs ``tuning.build.build_table`` takes (``BuildSettings``), at the defaults of the pipeline's
``TuningSettings`` resource: the gates' thresholds and the table search's settings."""


@dataclass
class FakeEngine:
    """Scripted measurements (``samples.scripted_*``), the way ``deployments.Engine`` is called."""

    vllm_version: str = "0.32.0+cpu"
    rates: tuple[float, ...] = RATES
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    fail_after_cells: int = -1
    fail_acceptance_for: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    served_verification: dict[str, Any] = field(default_factory=dict)
    verification_crashes: bool = False
    acceptance_options: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)

    def current_identity(self, dep):
        if dep.name in self.unreachable:
            raise EndpointUnreachable(f"{dep.name}: scripted: no answer")
        return identity_for(dep, self.vllm_version)

    def local_model_path(self, name, drafter=False, dtype=None):
        return f"/models/{name.replace(':', '-')}{'-draft' if drafter else ''}" if name else name

    def profile(self, identity, dep, store, log):
        self.calls.append(("profile", identity.key))
        return scripted_profile(identity, store, self.batch_sizes, self.fail_after_cells)

    def measure_acceptance(self, identity, dep, prompts_file, week, log):
        if dep.name in self.fail_acceptance_for:
            raise EngineCrashedError(f"scripted crash while measuring acceptance of {dep.name}")
        return scripted_prior(identity, dep, prompts_file, week, self.rates)

    def served_verification_options(self):
        return ServedVerificationOptions.from_mapping(self.served_verification, where="FakeEngine served_verification")

    def verify_served(self, identity, dep, table, prior, log):
        self.calls.append(("verify_served", dep.name, table.table_id))
        if self.verification_crashes:
            raise EngineCrashedError("scripted crash of the verification launch")
        return scripted_verification(identity, table, self.rates, self.served_verification_options())


class Log:
    """A logger that keeps its lines: ``log.warnings`` etc."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def _at(self, level: str):
        return lambda msg, *a, **k: self.lines.append((level, str(msg)))

    def __getattr__(self, level: str):
        if level in ("debug", "info", "warning", "error"):
            return self._at(level)
        raise AttributeError(level)

    def of(self, level: str) -> list[str]:
        return [m for lv, m in self.lines if lv == level]


def fleet(home: Path, *names: str, **over: Any) -> Fleet:
    """Deployments of the embedded default's shape (tiny model, K = 3, max_num_seqs 16) under ``home``."""
    docs = [{"name": n, "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": "tiny:small",
             "method": "draft_model", "max_k": 3, "max_num_seqs": 16, "logged_prompts": f"prompts/{n}",
             "published_table": f"published/{n}.json", "live_counters": f"live/{n}.jsonl", **over}
            for n in names or ("local-cpu",)]
    return parse_fleet({"schema_version": 1, "deployments": docs}, base_dir=home)


def store(home: Path) -> TableTuneStore:
    return TableTuneStore(home / "tabletune_store.duckdb")


def write_prompts(path: Path, n: int = 24) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"the cat sat on the mat #{i}"}) + "\n" for i in range(n)))
    return path
