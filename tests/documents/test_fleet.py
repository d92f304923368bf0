"""The fleet schema (pydantic, declared once): new keys, bounds, and errors that name file, deployment and key.

The loader's behaviour on the embedded default and the classic errors are in
tests/pipeline/test_pipeline_fleet.py; this module covers the schema itself.
"""

from __future__ import annotations

import pydantic
import pytest
import yaml

from tabletune_pipelines.formats.fleet import Deployment, Fleet, FleetError, K8sPlacement, fleet_json_schema, load_fleet
from tabletune_pipelines.formats.fleet import parse_fleet
from tabletune_pipelines.vocab import DEFAULT_SAMPLE_SIZE, METHODS, MODEL_RUNNERS


def dep(**over):
    d = {"name": "a", "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": "tiny:small",
         "method": "draft_model", "max_k": 3, "max_num_seqs": 16, "logged_prompts": "prompts",
         "published_table": "published/a.json"}
    d.update(over)
    return d


def fleet(*deps, source="F.yaml"):
    return parse_fleet({"schema_version": 1, "deployments": list(deps) or [dep()]}, source=source)


def problems(*deps) -> list[str]:
    with pytest.raises(FleetError) as err:
        fleet(*deps)
    return str(err.value).splitlines()


def test_defaults_come_from_the_vocabulary_and_new_keys_exist(tmp_path):
    d = fleet().deployments[0]
    assert d.dtype is None and d.max_prompts == DEFAULT_SAMPLE_SIZE
    assert d.model_runner == "auto" and d.load_format is None and d.controller == {} and d.k8s is None
    d = fleet(dep(model_runner="v2", load_format="dummy", controller={"rebuild_every_steps": 8, "hysteresis": 2})).deployments[0]
    assert (d.model_runner, d.load_format, d.controller) == ("v2", "dummy", {"rebuild_every_steps": 8, "hysteresis": 2})


def test_every_field_is_described_in_the_schema():
    for model in (Fleet, Deployment, K8sPlacement):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
    schema = fleet_json_schema()
    props = schema["$defs"]["Deployment"]["properties"]
    assert set(props["model_runner"]["enum"]) == set(MODEL_RUNNERS)
    assert set(props["method"]["enum"]) == set(METHODS)
    assert schema["$defs"]["Deployment"]["additionalProperties"] is False


@pytest.mark.parametrize("over, line", [
    ({"max_k": 17}, "'max_k' = 17 must be <= 16"),
    ({"max_k": 0}, "'max_k' = 0 must be >= 1"),
    ({"max_num_seqs": 4097}, "'max_num_seqs' = 4097 must be <= 4096"),
    ({"max_num_seqs": 2.0}, "'max_num_seqs' = 2.0 must be an integer"),
    ({"temperature": -0.1}, "'temperature' = -0.1 must be >= 0.0"),
    ({"temperature": float("nan")}, "'temperature' = nan must be a finite number"),
    ({"temperature": float("inf")}, "'temperature' = inf must be a finite number"),
    ({"temperature": True}, "'temperature' = True must be a number"),
    ({"max_prompts": 0}, "'max_prompts' = 0 must be >= 1"),
    ({"name": "a\n"}, "'name' = 'a\\n' may only use letters"),
    ({"name": ".."}, "'name' = '..' may only use letters"),
    ({"engine_group": "g/h"}, "'engine_group' = 'g/h' may only use letters"),
    ({"method": "medusa"}, "'method' = 'medusa' must be one of 'draft_model'"),
    ({"model_runner": "v3"}, "'model_runner' = 'v3' must be one of 'auto', 'v1' or 'v2'"),
    ({"load_format": 1}, "'load_format' = 1 must be a string"),
    ({"controller": [1]}, "'controller' = [1] must be a mapping"),
    ({"dtype": ""}, "'dtype' = '' must not be empty"),
    ({"speculative_config": {1: 2}}, "'speculative_config' has the key 1; keys must be a string"),
    ({"model": "--trust-remote-code"}, "'model' = '--trust-remote-code' must be a model name or path"),
    ({"drafter": " "}, "'drafter' = ' ' must be a model name or path"),
    ({"speculative_config": {"method": "eagle"}}, "sets 'method', which it may not override; set it with the "
                                                   "deployment's 'method'"),
    ({"speculative_config": {"num_speculative_tokens": 8}}, "set it with the deployment's 'max_k'"),
    ({"speculative_config": {"num_speculative_tokens_per_batch_size": [[1, 16, 1]]}},
     "TableTune writes the table itself"),
    ({"k8s": {"gpu_count": -1}}, "k8s: 'gpu_count' = -1 must be >= 0"),
    ({"k8s": {"node_selector": {"gpu": 1}}}, "k8s: 'node_selector.gpu' = 1 must be a string"),
])
def test_bad_values_name_file_deployment_and_key(over, line):
    (msg,) = problems(dep(**over))
    name = over["name"] if "name" in over else "a"
    assert msg.startswith(f"fleet file F.yaml, deployment {name!r}")
    assert line in msg


def test_every_problem_is_one_line():
    msgs = problems(dep(max_k=0, max_num_seqs="16", bogus=1), dep(name="b", gpu=None))
    assert len(msgs) == 4
    assert all(m.startswith("fleet file F.yaml, deployment ") for m in msgs)
    assert any("unknown key 'bogus'; allowed keys are [" in m for m in msgs)
    assert any(m.startswith("fleet file F.yaml, deployment 'b': 'gpu' = None") for m in msgs)


def test_values_are_not_coerced_but_k8s_quantities_become_text():
    with pytest.raises(FleetError, match="'max_k' = '3' must be an integer"):
        fleet(dep(max_k="3"))
    k = fleet(dep(k8s={"resources": {"cpu": 8, "memory": "64Gi"}, "tolerations": [{"key": "x"}]})).deployments[0].k8s
    assert k.resources == {"cpu": "8", "memory": "64Gi"} and k.tolerations == ({"key": "x"},)


def test_a_loaded_fleet_is_frozen_and_knows_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path))
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "deployments": [dep()]}))
    f = load_fleet(path)
    assert f.source == str(path) and f.deployments[0].published_table == tmp_path / "published" / "a.json"
    with pytest.raises(pydantic.ValidationError):
        f.deployments[0].max_k = 4  # type: ignore[misc]
    with pytest.raises(FleetError, match=r"deployment 'nosuch' is not in the fleet file .*\['a'\]"):
        f.deployment("nosuch")


def test_source_is_not_a_key_of_the_file():
    with pytest.raises(FleetError, match="unknown key 'source'"):
        parse_fleet({"schema_version": 1, "deployments": [dep()], "source": "x"})


def test_not_utf8_is_a_fleet_error(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_bytes(b"schema_version: 1\n# caf\xe9\n")
    with pytest.raises(FleetError, match="is not UTF-8 text"):
        load_fleet(path)
