"""deployments.py: a deployment → its identity, options of measurement launches (the paste-able config:
test_publishing.py).

Library calls only (no engine launch, no Dagster): measurement itself is covered by the engine tests
and test_pipeline_real_engine.py.
"""

from __future__ import annotations

import socket

import pytest

from tabletune_pipelines.tuning import deployments
from tabletune_pipelines.errors import (
    EndpointUnreachable,
    EngineMismatchError,
    InvalidValueError,
    NotFoundError,
    TableTuneError,
)
from tabletune_pipelines.formats.fleet import parse_fleet


def fleet(tmp_path, *deps):
    base = {"endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": "tiny:small",
            "method": "draft_model", "max_k": 3, "max_num_seqs": 16}
    docs = [{**base, "name": d.get("name", "local-cpu"), "logged_prompts": "p",
             "published_table": f"{d.get('name', 'local-cpu')}.json", **d}
            for d in deps or [{}]]
    return parse_fleet({"schema_version": 1, "deployments": docs}, base_dir=tmp_path)


def test_options_from_a_mapping_name_unknown_keys():
    opts = deployments.ProfileOptions.from_mapping({"batch_sizes": [1, 4], "repetitions": 2, "startup_timeout": 60},
                                                   where="EngineResource")
    assert opts.batch_sizes == (1, 4) and opts.repetitions == 2 and opts.server_overrides() == {"startup_timeout": 60}
    with pytest.raises(TableTuneError, match=r"EngineResource: unknown key\(s\) \['batch_sizez'\]"):
        deployments.ProfileOptions.from_mapping({"batch_sizez": [1]}, where="EngineResource")
    acc = deployments.AcceptanceOptions.from_mapping({"max_tokens": 16})
    assert acc.max_tokens == 16 and acc.server_overrides() == {}
    with pytest.raises(InvalidValueError, match=r"acceptance options: unknown key\(s\) \['max_token'\]"):
        deployments.AcceptanceOptions.from_mapping({"max_token": 16})


def test_identity_and_the_deployment_that_runs_it(tmp_path):
    f = fleet(tmp_path, {"name": "a"}, {"name": "b", "max_num_seqs": 32})
    a, b = f.deployments
    ident = deployments.identity_for(b, "0.32.0+cpu")
    assert ident.max_num_seqs == 32 and ident.vllm_version == "0.32.0+cpu"
    assert deployments.same_engine(b, ident) and not deployments.same_engine(a, ident)
    assert deployments.deployment_for_identity(f, ident) == b
    assert deployments.deployment_for_identity(f, ident, preferred="a") == a


def test_resolve_identity_in_order_config_store_fleet(tmp_path):
    f = fleet(tmp_path)
    dep = f.deployments[0]
    ident = deployments.identity_for(dep, "0.32.0+cpu")
    other = deployments.identity_for(dep, "0.99.0")

    def running(d):
        return ident

    def never(key):
        return None

    kw = {"fleet": f, "identity_of": running}
    assert deployments.resolve_identity(ident.key, identity_json=ident.to_json(), known=never, **kw) == ident
    with pytest.raises(InvalidValueError, match="run config identity_json has key"):
        deployments.resolve_identity(other.key, identity_json=ident.to_json(), known=never, **kw)
    assert deployments.resolve_identity(other.key, identity_json="", known=lambda k: other, **kw) == other
    assert deployments.resolve_identity(ident.key, identity_json="", known=never, **kw) == ident

    def unreachable(d):
        raise EndpointUnreachable("http://x/version did not answer")

    with pytest.raises(NotFoundError, match=r"not an engine identity TableTune knows.*unreachable: local-cpu"):
        deployments.resolve_identity(other.key, identity_json="", known=never, fleet=f, identity_of=unreachable)


def test_deployments_running_notes_the_unreachable(tmp_path):
    f = fleet(tmp_path, {"name": "up"}, {"name": "down"})
    ident = deployments.identity_for(f.deployments[0], "0.32.0+cpu")

    def identity_of(d):
        if d.name == "down":
            raise EndpointUnreachable("no answer")
        return ident

    running, notes = deployments.deployments_running(ident.key, f, identity_of)
    assert [d.name for d in running] == ["up"] and notes == ["down: unreachable (no answer)"]


def test_probe_of_a_closed_port_is_endpoint_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointUnreachable, match=f"127.0.0.1:{port}/version did not answer"):
        deployments.probe_vllm_version(f"http://127.0.0.1:{port}", timeout_s=2)


@pytest.mark.parametrize("version", ["", "0.32.0"])
def test_probe_reads_version_by_the_clients_rule(version):
    """``probe_vllm_version`` reads ``/version`` with ``engine.client.version_from_answer``: an empty
    version is an unreachable endpoint, as it is for the engine's own client."""
    from tests.pipeline.helpers import VersionServer

    with VersionServer(version) as srv:
        if version:
            assert deployments.probe_vllm_version(srv.url, timeout_s=5) == version
        else:
            with pytest.raises(EndpointUnreachable, match="not vLLM's"):
                deployments.probe_vllm_version(srv.url, timeout_s=5)


def test_a_partition_of_another_vllm_is_refused_before_any_launch(tmp_path):
    ident = deployments.identity_for(fleet(tmp_path).deployments[0], "0.0.1-not-installed")
    with pytest.raises(EngineMismatchError, match="needs vLLM 0.0.1-not-installed"):
        deployments.check_local_engine(ident)


