"""Partitions: one dynamic partition per engine identity, one weekly partition per week (UTC).

* ``engine_identity``: keys are ``EngineIdentity.key`` (GPU × vLLM version × model/drafter/method ×
  max k × max_num_seqs + a digest). Added by the upgrade sensor (``sensors.py``) when a
  deployment starts running an engine not seen before, or by the main command (``embedded.py``)
  before it profiles one; never by hand (but ``dagster`` CLI / UI can). A profile run of an
  identity carries ``profile_run_config`` (the deployment and the identity itself).
* ``weekly``: weeks start Monday 00:00 UTC; the key is that Monday's date ``YYYY-MM-DD``, which is
  also the name of the week's logged-prompt file (``<logged_prompts>/<key>.jsonl``). Only complete
  weeks are partitions; the weekly schedule measures the week that just ended.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import dagster as dg

if TYPE_CHECKING:
    from tabletune_pipelines.formats.documents import EngineIdentity

ENGINE_IDENTITY_PARTITIONS_NAME = "engine_identity"
"""Name of the dynamic partitions (one per engine identity key)."""
WEEKLY_START = "2024-01-01"  # a Monday

engine_identity_partitions = dg.DynamicPartitionsDefinition(name=ENGINE_IDENTITY_PARTITIONS_NAME)
weekly_partitions = dg.WeeklyPartitionsDefinition(start_date=WEEKLY_START, day_offset=1, timezone="UTC")


def register_identity(instance: dg.DagsterInstance, key: str) -> bool:
    """Add engine identity ``key`` to ``instance``'s ``engine_identity`` partitions unless it is
    there already; whether it was added. (A sensor cannot write to the instance: the upgrade sensor
    returns ``engine_identity_partitions.build_add_request`` with its new keys instead.)"""
    if instance.has_dynamic_partition(ENGINE_IDENTITY_PARTITIONS_NAME, key):
        return False
    instance.add_dynamic_partitions(ENGINE_IDENTITY_PARTITIONS_NAME, [key])
    return True


def profile_run_config(deployment: str, identity: EngineIdentity) -> dict[str, Any]:
    """The run config of a run that profiles ``identity`` (partition ``identity.key``) for
    ``deployment``: ``step_time_profile``'s ``ProfileConfig``, the identity passed whole so the run
    profiles exactly what was seen (``deployments.resolve_identity``)."""
    return {"ops": {"step_time_profile": {"config": {"deployment": deployment, "identity_json": identity.to_json()}}}}


def week_start(dt: datetime) -> str:
    """Key of the week (Monday, UTC) containing ``dt``."""
    d = dt.astimezone(timezone.utc).date()
    return (d - timedelta(days=d.weekday())).isoformat()


def last_complete_week(now: datetime) -> str:
    """Key of the most recent week that has fully ended at ``now``."""
    return (datetime.fromisoformat(week_start(now)) - timedelta(days=7)).date().isoformat()


def week_bounds(key: str) -> tuple[datetime, datetime]:
    """[start, end) of the week ``key`` (Monday 00:00 UTC to the next Monday 00:00 UTC)."""
    start = datetime.fromisoformat(key).replace(tzinfo=timezone.utc)
    return start, start + timedelta(days=7)
