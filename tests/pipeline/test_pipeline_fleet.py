"""The fleet file: documented schema, strict loader, embedded default."""

from __future__ import annotations

import pytest
import yaml

from tabletune_pipelines.formats.fleet import DEFAULT_FLEET_PATH, FleetError, load_fleet, parse_fleet
from tabletune_pipelines.orchestration.tags import default_engine_tag, run_tags
from tests.pipeline.helpers import deployment_dict, write_fleet


def test_embedded_default_loads(home):
    fleet = load_fleet()
    assert fleet.source == str(DEFAULT_FLEET_PATH)
    (dep,) = fleet.deployments
    assert dep.embedded and dep.gpu == "cpu" and dep.max_k >= 1
    assert dep.logged_prompts == home / "prompts" / "local-cpu"
    assert dep.published_table == home / "published" / "local-cpu.json"
    assert dep.speculative_config_path.name == "local-cpu.speculative-config.json"
    assert default_engine_tag(fleet) == "local-cpu"
    assert run_tags(dep) == {"tabletune/engine": "local-cpu", "tabletune/deployment": "local-cpu"}


def test_relative_paths_resolve_against_the_file(home):
    fleet = load_fleet(write_fleet(home / "cfg", [deployment_dict()]))
    assert fleet.deployments[0].logged_prompts == home / "cfg" / "prompts" / "local-cpu"


@pytest.mark.parametrize("where", ["top", "deployment", "k8s"])
def test_unknown_key_is_named(home, where):
    dep = deployment_dict(k8s={"node_selector": {"gpu": "h100"}})
    doc = {"schema_version": 1, "deployments": [dep]}
    if where == "top":
        doc["deployment"] = []
    elif where == "deployment":
        dep["max_num_seq"] = 8
    else:
        dep["k8s"]["nodeSelector"] = {}
    path = home / "f.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    msg = str(err.value)
    bad = {"top": "'deployment'", "deployment": "'max_num_seq'", "k8s": "'nodeSelector'"}[where]
    assert "unknown key " + bad in msg and str(path) in msg
    if where != "top":
        assert "deployment 'local-cpu'" in msg


def test_missing_field_is_named(home):
    dep = deployment_dict()
    del dep["published_table"]
    with pytest.raises(FleetError, match=r"deployment 'local-cpu': missing required key 'published_table'"):
        load_fleet(write_fleet(home, [dep]))


def test_missing_name_names_the_index(home):
    dep = deployment_dict()
    del dep["name"]
    with pytest.raises(FleetError, match=r"deployments\[0\]: missing required key 'name'"):
        load_fleet(write_fleet(home, [dep]))


@pytest.mark.parametrize("over, match", [
    ({"max_k": "3"}, r"'max_k' = '3' must be an integer"),
    ({"max_k": 0}, r"'max_k' = 0 must be >= 1"),
    ({"endpoint": "localhost:8000"}, r"must be 'embedded' or an http"),
    ({"method": "ngram"}, r"must be null for method 'ngram'"),
    ({"drafter": None}, r"needs a draft model"),
    ({"max_num_seqs": True}, r"'max_num_seqs' = True must be an integer"),
    ({"logged_prompts": "${NOPE_NOT_SET}/x"}, r"uses \$\{NOPE_NOT_SET\}, which is not set"),
])
def test_bad_values_are_named(home, over, match):
    with pytest.raises(FleetError, match=match):
        load_fleet(write_fleet(home, [deployment_dict(**over)]))


def test_duplicates_versions_and_yaml(home):
    with pytest.raises(FleetError, match="appears twice"):
        parse_fleet({"schema_version": 1, "deployments": [deployment_dict(), deployment_dict()]})
    with pytest.raises(FleetError, match="schema_version 2 is not supported"):
        parse_fleet({"schema_version": 2, "deployments": [deployment_dict()]})
    with pytest.raises(FleetError, match="'deployments' is empty"):
        parse_fleet({"schema_version": 1, "deployments": []})
    bad = home / "bad.yaml"
    bad.write_text("schema_version: [1\n")
    with pytest.raises(FleetError, match="not valid YAML"):
        load_fleet(bad)
    with pytest.raises(FleetError, match="does not exist"):
        load_fleet(home / "missing.yaml")


def test_env_default_expansion(home, monkeypatch):
    monkeypatch.setenv("PROMPTS_ROOT", "/data/p")
    fleet = parse_fleet({"schema_version": 1, "deployments": [deployment_dict(
        logged_prompts="${PROMPTS_ROOT}/a", published_table="${PUB_ROOT:-/srv/pub}/a.json")]})
    d = fleet.deployments[0]
    assert str(d.logged_prompts) == "/data/p/a" and str(d.published_table) == "/srv/pub/a.json"
