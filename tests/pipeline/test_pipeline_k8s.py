"""Kubernetes placement per deployment, validated with dagster-k8s's own code and no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tabletune_pipelines.formats.fleet import FleetError, load_fleet
from tabletune_pipelines.orchestration.tags import K8S_CONFIG_TAG, run_tags
from tests.pipeline.helpers import ScriptedEngine, VersionServer, deployment_dict, write_fleet

dagster_k8s = pytest.importorskip("dagster_k8s")
from dagster_k8s.job import (  # noqa: E402
    DagsterK8sJobConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def build_job(tags: dict[str, str]):
    cfg = DagsterK8sJobConfig(job_image="registry.example.com/tabletune:default", dagster_home="/opt/dagster/home",
                              instance_config_map="tabletune-dagster-instance")
    return construct_dagster_k8s_job(cfg, ["dagster", "api", "execute_run", "{}"], "dagster-run-abc",
                                     user_defined_k8s_config=get_user_defined_k8s_config(tags))


def test_example_fleet_places_runs_on_the_deployment_gpu_nodes(home):
    fleet = load_fleet(DEPLOY / "fleet.example.yaml")
    h100 = fleet.deployment("chat-h100")
    tags = run_tags(h100)
    assert tags["tabletune/engine"] == "h100-profiling-pool"
    job = build_job(tags)
    pod = job.spec.template.spec
    assert pod.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations] == [("nvidia.com/gpu", "Exists", "NoSchedule")]
    (container,) = pod.containers
    assert container.image == "registry.example.com/tabletune:vllm-0.32.0-cu130"
    assert container.resources.limits == {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}
    assert job.spec.template.metadata.labels["tabletune/deployment"] == "chat-h100"
    assert job.metadata.labels["tabletune/gpu"] == "H100"

    a10g = build_job(run_tags(fleet.deployment("moe-a10g"))).spec.template.spec
    assert a10g.node_selector == {"node.kubernetes.io/instance-type": "g5.12xlarge"}
    assert a10g.containers[0].resources.limits == {"nvidia.com/gpu": "4"}
    assert a10g.containers[0].image == "registry.example.com/tabletune:default"  # no per-deployment image
    assert a10g.service_account_name == "tabletune-gpu-runs"


def test_embedded_default_has_no_k8s_tag(home):
    (dep,) = load_fleet().deployments
    assert K8S_CONFIG_TAG not in run_tags(dep)


def test_bad_k8s_block_is_caught_by_the_fleet_loader_or_dagster_k8s(home):
    with pytest.raises(FleetError, match="unknown key 'nodeselector'"):
        load_fleet(write_fleet(home, [deployment_dict(k8s={"nodeselector": {}})]))
    # A toleration with a field Kubernetes does not know is rejected by dagster-k8s's validator.
    dep = load_fleet(write_fleet(home, [deployment_dict(k8s={"tolerations": [{"kee": "x"}]})])).deployments[0]
    with pytest.raises(Exception, match="kee"):
        build_job(run_tags(dep))


def test_k8s_instance_config_validates_against_dagster_schemas():
    from dagster._config import process_config
    from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher

    doc = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    assert doc["run_launcher"]["module"] == "dagster_k8s" and doc["run_launcher"]["class"] == "K8sRunLauncher"
    env = {"TABLETUNE_IMAGE": "registry.example.com/tabletune:1"}
    import os
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = process_config(K8sRunLauncher.config_type(), doc["run_launcher"]["config"])
        assert res.success, res.errors
        assert res.value["job_image"] == "registry.example.com/tabletune:1"
        res = process_config(QueuedRunCoordinator.config_type(), doc["run_queue"])
        assert res.success, res.errors
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    assert doc["run_queue"]["tag_concurrency_limits"][0] == {
        "key": "tabletune/engine", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}


def test_sensor_run_requests_carry_the_k8s_tag(home):
    import dagster as dg

    from tabletune_pipelines.orchestration.resources import FleetResource
    from tabletune_pipelines.definitions import defs

    with VersionServer("0.32.0") as srv, dg.DagsterInstance.ephemeral() as inst:
        fleet = write_fleet(home, [deployment_dict("g", endpoint=srv.url, gpu="A10G",
                                                   k8s={"node_selector": {"gpu": "a10g"}, "gpu_count": 2})])
        ctx = dg.build_sensor_context(instance=inst, resources={"fleet": FleetResource(path=str(fleet)),
                                                                "engine": ScriptedEngine()})
        (req,) = defs().resolve_sensor_def("engine_upgrade_sensor")(ctx).run_requests
        pod = build_job(req.tags).spec.template.spec
        assert pod.node_selector == {"gpu": "a10g"}
        assert pod.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
        assert json.loads(req.tags[K8S_CONFIG_TAG])["pod_template_spec_metadata"]["labels"]["tabletune/gpu"] == "A10G"
