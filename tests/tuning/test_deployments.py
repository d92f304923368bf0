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




def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_the_fleets_graph_envelope_reaches_every_measuring_launch(tmp_path, monkeypatch):
    """A deployment that pins its capture ceiling and token budget is profiled, measured and verified
    in that envelope: every launch's command carries both flags, and the compile caches of a GPU
    launch live under the home, per engine."""
    import json

    from tabletune_pipelines.engine.command import build_command
    from tabletune_pipelines.engine.plan import fixed_k_config, per_k_config, switching_config

    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    f = fleet(tmp_path, {"name": "h200", "gpu": "H200", "model": "/m/target", "drafter": "/m/eagle3",
                         "method": "eagle3", "max_num_seqs": 128, "max_cudagraph_capture_size": 1024,
                         "max_num_batched_tokens": 8192})
    dep = f.deployments[0]
    ident = deployments.identity_for(dep, "0.26.0")
    assert deployments.launch_envelope(ident) == {"max_cudagraph_capture_size": 1024, "max_num_batched_tokens": 8192}
    base = deployments._server_config(ident, dep, tmp_path, tmp_path / "w", {})
    table = deployments.verification_launch_table(128, 3)
    launches = {
        "profile (one launch)": switching_config(base, [0, 1, 2, 3], 0.0, str(tmp_path)),
        "profile (launch per k)": per_k_config(base, 2, str(tmp_path)),
        "per-k baseline": fixed_k_config(base, 2, str(tmp_path)),
        "acceptance": deployments._server_config(ident, dep, tmp_path, tmp_path / "a", {"max_model_len": 1024}),
        "verification": deployments._server_config(ident, dep, tmp_path, tmp_path / "v",
                                                   {"table": table, "synthetic_acceptance_rates": (0.7, 0.5, 0.3)}),
    }
    for name, cfg in launches.items():
        cmd = build_command(cfg, 8000, "gpu")
        assert json.loads(_flag(cmd, "--compilation-config")) == {"max_cudagraph_capture_size": 1024}, name
        assert _flag(cmd, "--max-num-batched-tokens") == "8192", name
        assert cfg.extra_env["VLLM_CACHE_ROOT"] == str(deployments.compile_cache_dir(ident) / "vllm"), name
    assert deployments.compile_cache_dir(ident).parent == tmp_path / "home" / "compile-cache"
    # vLLM's own envelope is left to vLLM; the CPU build compiles nothing and keeps its own cache.
    plain = deployments.identity_for(fleet(tmp_path, {"gpu": "H200", "model": "/m", "drafter": "/d"}).deployments[0],
                                     "0.26.0")
    assert deployments.launch_envelope(plain) == {}
    assert "--compilation-config" not in build_command(deployments._server_config(plain, None, tmp_path, tmp_path, {}),
                                                        8000, "gpu")
    cpu = deployments.identity_for(fleet(tmp_path).deployments[0], "0.32.0+cpu")
    assert deployments.compile_cache_env(cpu) == {}


def test_a_shared_launch_that_refuses_the_rate_switch_is_stopped_before_the_verification_launches(tmp_path,
                                                                                                   monkeypatch):
    """The flow's launch did not take the prior's rates: the verification launches its own server, and
    only after stopping the flow's (two launches at once share one GPU's memory)."""
    import logging

    from tabletune_pipelines.engine.envelope_log import envelope_checked  # noqa: F401 - patched below
    from tabletune_pipelines.engine.installed import installed_vllm_version
    from tabletune_pipelines.errors import EngineError
    from types import SimpleNamespace

    events: list[str] = []

    class Shared:
        def set_synthetic_rates(self, rates):
            events.append("switch")
            raise EngineError("the rate switch was not acknowledged within 30 s")

        def stop(self):
            events.append("stop shared")

    class Launched(Exception):
        pass

    def factory(identity, progress):
        def launch(cfg):
            events.append("launch own")
            raise Launched
        return launch

    monkeypatch.setattr("tabletune_pipelines.engine.envelope_log.envelope_checked", factory)
    monkeypatch.setattr("tabletune_pipelines.engine.acceptance.write_default_prompt_file",
                        lambda p: _prompts(tmp_path / "p.jsonl"))
    monkeypatch.setattr(deployments, "_real_model_overrides", lambda identity: {})
    dep = fleet(tmp_path).deployments[0]
    ident = deployments.identity_for(dep, installed_vllm_version())
    table = SimpleNamespace(ranges=((1, 16, 3),), acceptance_rates=(0.7, 0.5, 0.3))  # never served here
    from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions

    with pytest.raises(Launched):
        deployments.verify_served(ident, dep, table, None, log=logging.getLogger("t"), server=Shared(),
                                  options=ServedVerificationOptions(acceptance="prior"), cache_dir=tmp_path,
                                  work_dir=tmp_path / "v")
    assert events == ["switch", "stop shared", "launch own"]


def _prompts(path):
    import json

    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(4)), encoding="utf-8")
    return path
