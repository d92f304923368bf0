"""The tuning flow of one deployment without Dagster: profile, derive, verify, publish, each step timed.

The steps are the library functions the pipeline's assets call (``LocalEngine.profile``,
``build.build_table``, ``publishing.publish_table``). With ``one_launch`` (the default) one vLLM
launch serves the profile and the served verification (``deployments.one_launch``): every k is in
its launch table and switched at runtime, the profile runs at synthetic rates 0 and the verification
at the prior's rates, switched in at runtime. A deployment whose verification needs real acceptance
(real weights and prompts) still gets its own verification launch; docs/usage.md, "One launch", says
why. Printed as it goes: each step's wall time, the table, the gates and the verification's verdict
per load with its paired standard error (``flow_lines``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.fleet import Deployment, Fleet
from tabletune_pipelines.tuning.build import BuildSettings, DefaultBuildSettings, build_table
from tabletune_pipelines.tuning.deployments import LocalEngine, one_launch
from tabletune_pipelines.tuning.publishing import Publication, publish_table

__all__ = ["FLOW_STEPS", "FlowReport", "flow_lines", "run_flow"]

FLOW_STEPS = ("profile", "derive", "publish")
"""The steps, in order; a run may take some of them (a later one reads what an earlier run stored)."""


@dataclass
class FlowReport:
    """What one run of the flow did."""

    deployment: str
    identity: str
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per step (``launch`` too, with one launch), and ``total``."""
    table: list[list[int]] | None = None
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> {passed, warning, description} of the derive step's gates and the served check."""
    publication: Publication | None = None
    launches: int = 0
    """vLLM launches the flow's own steps made (the one launch, or the verification's own)."""

    def to_dict(self) -> dict[str, Any]:
        pub = self.publication
        out: dict[str, Any] = {"deployment": self.deployment, "identity": self.identity,
                               "seconds": {k: round(v, 1) for k, v in self.seconds.items()}, "table": self.table,
                               "gates": self.gates, "launches": self.launches}
        if pub is not None:
            out.update({"published_table": [list(r) for r in pub.table.ranges], "refusal": pub.refusal,
                        "published": [str(t.path) for t in pub.published],
                        "served_goodput_verified": {"passed": pub.gate.passed, "warning": pub.gate.warning,
                                                    "description": pub.gate.description,
                                                    "figures": dict(pub.gate.figures)}})
        return out


def run_flow(store: Any, fleet: Fleet, dep: Deployment, engine: LocalEngine, *, log: logging.Logger,
             steps: Sequence[str] = FLOW_STEPS, one_launch_flow: bool = True,
             before_derive: Callable[[EngineIdentity], None] | None = None,
             settings: BuildSettings = DefaultBuildSettings()) -> FlowReport:
    """Run ``steps`` of the flow for ``dep`` (see the module docstring). ``before_derive(identity)``
    runs first in the derive step (e.g. writes the prior the table is derived for)."""
    unknown = [s for s in steps if s not in FLOW_STEPS]
    if unknown:
        raise InvalidValueError(f"flow steps {list(steps)}: unknown {unknown}; give some of {list(FLOW_STEPS)}")
    identity = engine.current_identity(dep)
    report = FlowReport(deployment=dep.name, identity=identity.key)
    t_all = time.monotonic()
    with ExitStack() as stack:
        if one_launch_flow and ({"profile", "publish"} & set(steps)):
            t = time.monotonic()
            from tabletune_pipelines.engine.plan import ProfileOptions

            opts = ProfileOptions.from_mapping(engine.profile_options, where=f"{engine.where} profile_options")
            server = stack.enter_context(one_launch(identity, dep, log=log, options=opts,
                                                    cache_dir=engine.cache_dir, work_dir=engine._work("flow")))
            engine = dataclasses.replace(engine, server=server)
            report.launches += 1
            _timed(report, "launch", t, log)
        for step in steps:
            t = time.monotonic()
            if step == "profile":
                profile = engine.profile(identity, dep, store, log)
                log.info(f"[flow] profile: {len(profile.cells)} cells")
            elif step == "derive":
                if before_derive is not None:
                    before_derive(identity)
                built = build_table(store, identity.key, settings, log=log)
                report.table = [list(r) for r in built.table.ranges]
                report.gates.update({g.name: {"passed": g.passed, "warning": g.warning, "description": g.description}
                                     for g in built.gates})
            else:
                pub = publish_table(store, fleet, identity.key, engine, deployments=[dep.name],
                                    max_predicted_loss=settings.gates().max_predicted_loss, log=log)
                report.publication = pub
                report.gates[pub.gate.name] = {"passed": pub.gate.passed, "warning": pub.gate.warning,
                                               "description": pub.gate.description}
                if pub.gate.figures.get("launch_s") is not None:
                    report.launches += 1
            _timed(report, step, t, log)
    report.seconds["total"] = time.monotonic() - t_all
    for line in flow_lines(report):
        log.info(line)
    return report


def _timed(report: FlowReport, step: str, t: float, log: logging.Logger) -> None:
    report.seconds[step] = time.monotonic() - t
    log.info(f"[flow] {step}: {report.seconds[step]:.1f} s")


def flow_lines(report: FlowReport) -> list[str]:
    """The flow in a few lines: wall time per step, the table, the gates, the verification per load."""
    lines = ["[flow] wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items())]
    if report.table is not None:
        lines.append(f"[flow] derived table {report.table}")
    for name, g in report.gates.items():
        state = "WARNING" if g.get("warning") else "ok" if g["passed"] else "FAILED"
        lines.append(f"[flow] gate {name}: {state}")
    pub = report.publication
    if pub is not None:
        sv = pub.gate.figures
        if sv.get("verdict"):
            lines.append(f"[flow] served verification: {str(sv['verdict']).upper()} (tolerance "
                         f"{sv.get('tolerance', 0):.0%}; stop per load {sv.get('stop_reasons', {})})")
        lines += [f"[flow]   {line}" for line in pub.gate.comparison.splitlines()]
        lines.append(f"[flow] {pub.refusal}" if pub.refusal else
                     "[flow] published " + "; ".join(f"{t.deployment} v{t.version} ({t.path})" for t in pub.published))
    return lines
