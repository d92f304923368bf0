"""The main job on the embedded default: ``tabletune run`` (or ``python -m tabletune_pipelines.embedded``).

Runs the whole pipeline once, in process, into a persistent Dagster instance (so the UI shows it
afterwards): the last complete week's acceptance prior (and live counters, if the controller
exported any), then for every deployment's current engine identity the step-time profile, the
draft-length table and the published table. Real vLLM (the CPU build), the tiny local models,
the DuckDB file under ``$TABLETUNE_HOME``. Ends by printing, per deployment, the
published table and where it is, then what was measured (``run_report.measured_lines``, the lines
``tabletune show`` prints): the acceptance a_i with their 95 % intervals, the size and mix of the
sample they were measured on, the goodput ratio of the table against the docs' example table with
its standard error, and the served verification's verdict.

On a fresh machine there are no logged prompts yet: for ``endpoint: embedded`` deployments the
week's prompt file is written as a sample week drawn from the real prompt mixes shipped in
packages (``prompt_mixes``: HumanEval code and WritingBench prose, half each unless ``--mix``
says otherwise), in the JSONL format users log, and the output says so.

Options: ``--quick`` (3 batch sizes, 2 repetitions), ``--week YYYY-MM-DD`` (a Monday; default the
last complete week, UTC), ``--mix code:0.5,prose:0.5`` (the sample week's mix when one is written).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Any

import dagster as dg

from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.orchestration.jobs import PROFILE_AND_PUBLISH_ASSETS, WEEKLY_ACCEPTANCE_ASSETS
from tabletune_pipelines.orchestration.partitions import last_complete_week, profile_run_config, register_identity
from tabletune_pipelines.orchestration.resources import EngineResource, default_resources
from tabletune_pipelines.orchestration.tags import ENGINE_TAG, run_tags

#: Dagster's console logger at INFO (its DEBUG event stream is in the UI).
LOGGERS = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
#: EngineResource profile_options (deployments.ProfileOptions fields) of ``--quick``.
QUICK_PROFILE = {"batch_sizes": [1, 4, 16], "repetitions": 2, "accept_batch_sizes": [], "remeasure_budget_s": 30.0}
#: EngineResource profile_options of the main job, sized to publish in about ten minutes on 2 cores
#: (docs/usage.md, "The main command"): repetitions of 32 decode steps, the adaptive plan from
#: B = 1, 9, 16 with 45 s after the first pass for bisection and repetitions, all-accepted cells and
#: mixed steps at the two ends of the grid, and no no-speculation launch (its ~55 s feed only the
#: non-blocking ``k0_costs_vs_no_spec`` check, which then says NOT MEASURED; on the embedded default
#: k = 0 measured within -9..+6 % of no speculation at B = 16; ``tabletune profile`` measures it).
FULL_PROFILE = {"decode_steps": 32, "coarse_points": 3, "remeasure_budget_s": 45.0, "accept_batch_sizes": [1, 16],
                "mixed_batch_sizes": [1, 15], "include_no_spec": False}
#: EngineResource served_verification of the main job: each load serves the fixed k the profile does not
#: rule out there (``served_plan.plausible_fixed_ks``), so a round is as short as the decision allows.
FULL_VERIFICATION = {"fixed_k": "plausible"}
#: The Dagster instance file that seeds a new Dagster home: package data, the same file as the checkout's
#: top-level dagster.yaml, so an installed package seeds it too.
DAGSTER_YAML = Path(str(files("tabletune_pipelines") / "data" / "dagster.yaml"))
#: The code location's module, as ``workspace.yaml``, ``dg`` and the UI load it.
CODE_LOCATION = "tabletune_pipelines.definitions"


def prepare_dagster_home() -> Path:
    """``$DAGSTER_HOME``, else ``$TABLETUNE_HOME/dagster``: made if missing, seeded with ``DAGSTER_YAML``
    when it has no ``dagster.yaml`` (one it has is kept), and exported as ``DAGSTER_HOME``."""
    from tabletune_pipelines.formats.fleet import tabletune_home

    home = Path(os.environ.get("DAGSTER_HOME") or tabletune_home() / "dagster").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        shutil.copy(DAGSTER_YAML, cfg)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _dtype_reason(dep) -> str:
    from tabletune_pipelines.engine.dtype import default_dtype_choice

    return default_dtype_choice("cpu" if dep.gpu == "cpu" else "gpu").reason


#: The sample week written on a fresh machine: half code, half prose, 400 prompts (the measurement samples 160).
DEFAULT_MIX = "code:0.5,prose:0.5"
SAMPLE_WEEK_PROMPTS = 400


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``--quick``, ``--week`` and ``--mix`` (module docstring)."""
    parser = argparse.ArgumentParser(prog="tabletune run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small profile plan (3 batch sizes, 2 repetitions)")
    parser.add_argument("--week", help="week to measure acceptance for (Monday, YYYY-MM-DD); default last complete")
    parser.add_argument("--mix", default=DEFAULT_MIX,
                        help=f"mix of the sample week written when a week has no logged prompts "
                             f"(default {DEFAULT_MIX}; mixes: code = HumanEval, prose = WritingBench)")
    return parser.parse_args(argv)


def code_location_assets() -> list[Any]:
    """The assets of the code location, from the installed package (``tabletune_pipelines.definitions``,
    the module ``workspace.yaml`` and ``dg`` load), so ``tabletune run`` works from any folder."""
    from tabletune_pipelines.definitions import ASSETS

    return list(ASSETS)


def write_sample_weeks(fleet: Any, week: str, mix: str) -> bool:
    """A sample week of real prompts for every embedded deployment without logged prompts for
    ``week`` (module docstring); False (and the error printed) when the mix cannot be written."""
    from tabletune_pipelines.formats import prompt_mixes

    for dep in fleet.deployments:
        f = dep.prompts_file(week)
        if dep.embedded and not f.exists():
            try:
                prompt_mixes.write_week(f, mix, n=SAMPLE_WEEK_PROMPTS, seed=int(week.replace("-", "")))
            except TableTuneError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return False
            print(f"[tabletune] {dep.name}: no logged prompts for the week of {week}; wrote a sample week of "
                  f"{SAMPLE_WEEK_PROMPTS} real prompts ({mix}: code = HumanEval, prose = WritingBench) to {f} "
                  "(replace it with your logged prompts)")
    return True


def report_failure(result: dg.ExecuteInProcessResult, what: str) -> int:
    """Print each failed step of ``result``; the exit status of a failed run (1)."""
    for ev in result.all_events:
        if ev.event_type_value == "STEP_FAILURE":
            data = ev.step_failure_data
            if data.user_failure_data:
                desc = data.user_failure_data.description
            else:
                desc = data.error.message if data.error else "no error information"
            print(f"[tabletune] {what} failed in {ev.step_key}: {desc}", file=sys.stderr)
    return 1


def print_published(dep: Any, resources: Mapping[str, Any], key: str) -> None:
    """The published table of ``dep``, where it is, and what was measured (``run_report.measured_lines``,
    the lines ``tabletune show`` prints)."""
    from tabletune_pipelines.formats.published import load_published
    from tabletune_pipelines.store.duckdb_store import TableTuneStore
    from tabletune_pipelines.tuning.run_report import measured_lines

    doc = read_published_table(dep.published_table)
    print(f"\n[tabletune] {dep.name}: published table v{doc['version']} at {dep.published_table}")
    print("  num_speculative_tokens_per_batch_size = " + json.dumps(doc["table"]["ranges"]))
    print(f"[tabletune] --speculative-config for a deployment without the controller: "
          f"{dep.speculative_config_path}")
    print(f"[tabletune] {dep.name}: what was measured")
    try:
        store = TableTuneStore(resources["duckdb"].database, read_only=True)
        seed = int(resources["engine"].acceptance_options.get("seed", 0))
        for line in measured_lines(load_published(dep.published_table), dep, store, sample_seed=seed):
            print(line)
    except (TableTuneError, ValueError, KeyError) as exc:  # the table is published; only the summary failed
        print(f"[tabletune] {dep.name}: could not summarise the measurements: {exc}", file=sys.stderr)


def publish_deployment(assets: list[Any], dep: Any, resources: Mapping[str, Any], instance: dg.DagsterInstance) -> int:
    """Profile the current engine identity of ``dep``, derive and publish its table (one run of
    ``PROFILE_AND_PUBLISH_ASSETS``), then print it; 0 when published, 1 otherwise."""
    try:
        identity = resources["engine"].current_identity(dep)
    except TableTuneError as exc:
        print(f"[tabletune] {dep.name}: skipped, {exc}", file=sys.stderr)
        return 1
    key = identity.key
    register_identity(instance, key)
    print(f"[tabletune] {dep.name}: profiling {key} (dtype {identity.dtype}"
          + (", the fleet's choice" if dep.dtype else f": {_dtype_reason(dep)}")
          + "), deriving and publishing its table ...", flush=True)
    chain = dg.materialize(assets, selection=list(PROFILE_AND_PUBLISH_ASSETS), resources=resources,
                           instance=instance, partition_key=key, raise_on_error=False, tags=run_tags(dep),
                           run_config={**LOGGERS, **profile_run_config(dep.name, identity)})
    if not chain.success:
        return report_failure(chain, dep.name)
    print_published(dep, resources, key)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The week's acceptance, then every deployment's profile, table and publication (module docstring)."""
    args = parse_args(argv)
    dagster_home = prepare_dagster_home()
    fleet = load_fleet()
    week = args.week or last_complete_week(datetime.now(timezone.utc))
    resources = default_resources()
    resources["engine"] = EngineResource(profile_options=QUICK_PROFILE if args.quick else FULL_PROFILE,
                                         served_verification={} if args.quick else FULL_VERIFICATION)
    print(f"[tabletune] fleet {fleet.source}; store {resources['duckdb'].database}; Dagster home {dagster_home}")
    if not write_sample_weeks(fleet, week, args.mix):
        return 2
    assets = code_location_assets()
    with dg.DagsterInstance.get() as instance:
        print(f"[tabletune] measuring acceptance for the week of {week} ...", flush=True)
        weekly = dg.materialize(assets, selection=list(WEEKLY_ACCEPTANCE_ASSETS),
                                resources=resources, instance=instance, partition_key=week, raise_on_error=False,
                                tags={ENGINE_TAG: next(iter(fleet.groups()))}, run_config=LOGGERS)
        if not weekly.success:
            return report_failure(weekly, "acceptance")
        status = max((publish_deployment(assets, dep, resources, instance) for dep in fleet.deployments), default=0)
    print(f"\n[tabletune] open the UI on it:\n  DAGSTER_HOME={dagster_home} env --default-signal=INT,TERM "
          f"{Path(sys.executable).parent / 'dagster'} dev -m {CODE_LOCATION} -h 127.0.0.1 -p 3000")
    return status


if __name__ == "__main__":
    sys.exit(main())
