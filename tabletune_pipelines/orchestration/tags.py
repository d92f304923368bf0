"""Run tags: which engine a run uses (the run queue's concurrency key) and where it runs on Kubernetes.

``tabletune/engine`` is limited to one run per value in dagster.yaml, so two runs that share an
engine never overlap (their timings would be worthless). The sensor and the schedule set it from
the deployment's engine group; the jobs carry a default (``manual_run_tags``) so runs launched by
hand from the UI queue as well. ``dagster-k8s/config`` places a deployment's runs on its GPU nodes
(deploy/k8s/README.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tabletune_pipelines.formats.fleet import Deployment, Fleet, FleetError, load_fleet

ENGINE_TAG = "tabletune/engine"
"""Concurrency key: runs with the same value never overlap (dagster.yaml, run_queue)."""
DEPLOYMENT_TAG = "tabletune/deployment"
"""The deployment a run was requested for."""
IDENTITY_TAG = "tabletune/identity"
"""The engine identity key a run profiles or re-tunes."""
K8S_CONFIG_TAG = "dagster-k8s/config"
"""Read by dagster-k8s's K8sRunLauncher (run pods) and k8s_job_executor (step pods)."""
MANUAL_ENGINE = "manual"
"""``tabletune/engine`` of hand-launched runs when the fleet has several engine groups."""


def k8s_config(dep: Deployment) -> dict[str, Any] | None:
    """The ``dagster-k8s/config`` tag body placing this deployment's runs on its GPU nodes.

    Node selector + tolerations for the GPU type, a GPU resource limit (so the scheduler gives the
    pod a whole GPU and no other profiling pod shares it), and optionally the image carrying the
    deployment's vLLM version. None when the deployment has no ``k8s`` block.
    """
    k = dep.k8s
    if k is None:
        return None
    limits: dict[str, str] = {str(key): str(v) for key, v in dict(k.resources).items()}
    if k.gpu_resource and k.gpu_count > 0:
        limits[k.gpu_resource] = str(k.gpu_count)
    container: dict[str, Any] = {}
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if k.image:
        container["image"] = k.image
    pod_spec: dict[str, Any] = {}
    if k.node_selector:
        pod_spec["node_selector"] = dict(k.node_selector)
    if k.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in k.tolerations]
    if k.service_account:
        pod_spec["service_account_name"] = k.service_account
    # Label values: at most 63 characters of [A-Za-z0-9._-].
    labels = {DEPLOYMENT_TAG: dep.name, "tabletune/gpu": re.sub(r"[^A-Za-z0-9._-]", "-", dep.gpu)[:63]}
    return {
        "container_config": container,
        "pod_spec_config": pod_spec,
        "pod_template_spec_metadata": {"labels": labels},
        "job_metadata": {"labels": labels},
    }


def run_tags(dep: Deployment) -> dict[str, str]:
    """Tags of every run that uses this deployment's engine: the concurrency key and the placement."""
    tags = {ENGINE_TAG: dep.group, DEPLOYMENT_TAG: dep.name}
    cfg = k8s_config(dep)
    if cfg is not None:
        tags[K8S_CONFIG_TAG] = json.dumps(cfg, sort_keys=True)
    return tags


def engine_tag_warning(tags: Mapping[str, str], deployment: str, group: str) -> str | None:
    """What to warn when a run that wrote a deployment's table (the rollback) does not carry that
    deployment's ``tabletune/engine`` tag; None when it does."""
    tag = tags.get(ENGINE_TAG)
    if tag == group:
        return None
    return (f"this run's {ENGINE_TAG} tag is {tag!r}, not {deployment}'s engine group {group!r}: the run queue did "
            "not serialise it with that engine's runs (the publication lock still kept the store and the file in step)")


def default_engine_tag(fleet: Fleet | None) -> str:
    """``tabletune/engine`` of runs launched by hand: the fleet's only engine group, else "manual"."""
    if fleet is None:
        return MANUAL_ENGINE
    groups = fleet.groups()
    return next(iter(groups)) if len(groups) == 1 else MANUAL_ENGINE


def try_load_fleet() -> Fleet | None:
    """The fleet at definitions load time, or None if it is invalid (runs then report the error)."""
    try:
        return load_fleet()
    except FleetError:
        return None


def manual_run_tags(fleet: Fleet | None) -> dict[str, str]:
    """The tags every job carries by default (a sensor's or schedule's run request overrides them)."""
    return {ENGINE_TAG: default_engine_tag(fleet)}
