"""Sensors: re-profile when a deployment's engine changes; re-tune after new acceptance priors.

``engine_upgrade_sensor`` polls every deployment's engine identity (the fleet file + vLLM's
``GET /version`` for remote deployments, the installed vLLM for ``endpoint: embedded``). The cursor
remembers the identity key last seen per deployment. When a deployment shows a key it did not
have before and no partition exists for it yet, the sensor adds the dynamic partition and requests
exactly one ``profile_and_publish`` run for it (run key ``profile:<key>``, so a key is never
requested twice). An unreachable endpoint is logged and reported in the skip reason; it never
fails the tick and does not move that deployment's cursor.

Interval: ``TABLETUNE_SENSOR_INTERVAL_S`` (default 300 s), read when the code location loads
(``tabletune_pipelines/definitions.py`` ``defs`` calls ``build_sensors``), never at import.
"""

import json
import os

import dagster as dg

from tabletune_pipelines.errors import InvalidValueError, TableTuneError
from tabletune_pipelines.formats.fleet import FleetError
from tabletune_pipelines.orchestration.jobs import Jobs
from tabletune_pipelines.orchestration.partitions import (
    ENGINE_IDENTITY_PARTITIONS_NAME,
    engine_identity_partitions,
    profile_run_config,
)
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource
from tabletune_pipelines.orchestration.tags import IDENTITY_TAG, run_tags

DEFAULT_SENSOR_INTERVAL_S = 300
"""Seconds between upgrade-sensor ticks unless ``TABLETUNE_SENSOR_INTERVAL_S`` says otherwise."""


def sensor_interval_s() -> int:
    """Seconds between upgrade-sensor ticks: ``TABLETUNE_SENSOR_INTERVAL_S`` (read when the code
    location loads, never at import), default ``DEFAULT_SENSOR_INTERVAL_S``."""
    raw = os.environ.get("TABLETUNE_SENSOR_INTERVAL_S", str(DEFAULT_SENSOR_INTERVAL_S))
    if not raw.strip().isdigit() or int(raw) < 1:
        raise InvalidValueError(f"TABLETUNE_SENSOR_INTERVAL_S = {raw!r} must be a whole number of seconds >= 1")
    return int(raw)


def _cursor(raw: str | None) -> dict[str, str]:
    """The cursor as deployment name → identity key last seen; an unreadable cursor starts afresh."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return dict(data.get("identities", {})) if isinstance(data, dict) else {}


def check_engine_upgrades(context: dg.SensorEvaluationContext, fleet: FleetResource, engine: EngineResource):
    """A tick of ``engine_upgrade_sensor`` (the module docstring); ``build_sensors`` makes it the sensor."""
    seen = _cursor(context.cursor)
    try:
        the_fleet = fleet.load()
    except FleetError as exc:
        context.log.error(str(exc))
        return dg.SkipReason(f"fleet file invalid, nothing polled: {exc}")
    existing = set(context.instance.get_dynamic_partitions(ENGINE_IDENTITY_PARTITIONS_NAME))
    new_keys: list[str] = []
    run_requests: list[dg.RunRequest] = []
    problems: list[str] = []
    for dep in the_fleet.deployments:
        try:
            ident = engine.current_identity(dep)
        except TableTuneError as exc:  # EndpointUnreachable, or no vLLM installed for 'embedded'
            msg = f"{dep.name}: engine identity unknown ({exc})"
            context.log.warning(msg)
            problems.append(msg)
            continue
        key = ident.key
        if seen.get(dep.name) == key:
            continue
        previous = seen.get(dep.name)
        seen[dep.name] = key
        if key in existing or key in new_keys:
            context.log.info(f"{dep.name}: now runs {key}, already registered/profiled; no new run")
            continue
        context.log.info(f"{dep.name}: engine identity changed {previous or '(first seen)'} -> {key}")
        new_keys.append(key)
        run_requests.append(dg.RunRequest(
            run_key=f"profile:{key}",
            partition_key=key,
            tags={**run_tags(dep), IDENTITY_TAG: key},
            run_config=profile_run_config(dep.name, ident),
        ))
    cursor = json.dumps({"identities": seen}, sort_keys=True)
    if not run_requests:
        reason = "no engine identity changed"
        if problems:
            reason += "; " + "; ".join(problems)
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=[engine_identity_partitions.build_add_request(new_keys)],
        cursor=cursor,
    )


def request_retunes(context: dg.RunStatusSensorContext, fleet: FleetResource, engine: EngineResource):
    """``retune_after_acceptance`` after a successful weekly acceptance run; ``build_sensors`` makes it the sensor."""
    try:
        the_fleet = fleet.load()
    except FleetError as exc:
        return dg.SkipReason(f"fleet file invalid: {exc}")
    existing = set(context.instance.get_dynamic_partitions(ENGINE_IDENTITY_PARTITIONS_NAME))
    week = context.dagster_run.tags.get("dagster/partition", "")
    requests, done = [], set()
    for dep in the_fleet.deployments:
        try:
            key = engine.current_identity(dep).key
        except TableTuneError as exc:
            context.log.warning(f"{dep.name}: {exc}")
            continue
        if key in existing and key not in done:
            done.add(key)
            requests.append(dg.RunRequest(run_key=f"retune:{week}:{key}:{context.dagster_run.run_id}",
                                          partition_key=key, tags={**run_tags(dep), IDENTITY_TAG: key}))
    return requests or dg.SkipReason("no profiled engine identity is running in the fleet")


def build_sensors(jobs: Jobs, interval_s: int = DEFAULT_SENSOR_INTERVAL_S) -> list[dg.SensorDefinition]:
    """The code location's sensors, requesting ``jobs``.

    ``tabletune_pipelines/definitions.py`` ``defs`` builds them when it loads."""
    upgrade = dg.sensor(
        name="engine_upgrade_sensor",
        job=jobs.profile_and_publish,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=("Polls each deployment's engine identity (vLLM /version + fleet file; installed vLLM for the "
                     "embedded default). On a new identity: adds its engine_identity partition and requests one "
                     "profile_and_publish run. Unreachable endpoints are reported, never fatal."),
    )(check_engine_upgrades)
    retune = dg.run_status_sensor(
        name="retune_after_acceptance",
        run_status=dg.DagsterRunStatus.SUCCESS,
        monitored_jobs=[jobs.weekly_acceptance],
        request_job=jobs.retune,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="After a successful weekly acceptance run: re-tune and publish every engine identity a deployment "
                    "runs now (one run per identity).",
    )(request_retunes)
    return [upgrade, retune]
