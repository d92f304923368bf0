"""A published file is served only by the engine it was made for (the controller's side).

A file without an engine identity, with an incomplete one, one made on another GPU type or one
published for another deployment than the engine was told to serve (``TABLETUNE_DEPLOYMENT``) is
refused: the controller keeps the engine's own table, logs one line saying why, and the file is
left byte-identical. The same comparison (``identity_match.identity_mismatches``) decides for the
library (``deployments.same_engine``), tested against the loader on the same pairs.
"""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest

from tabletune_pipelines.controller.loader import DEPLOYMENT_ENV, EngineFacts, load_start
from tabletune_pipelines.tuning.deployments import same_engine
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
from tabletune_pipelines.evaluation.synthetic import ENGINE, IDENTITY, LAUNCH, publish
from tabletune_pipelines.formats.identity_match import engine_gpu, identity_mismatches, nvidia_gpu_name, same_gpu
from tests.readers.conftest import snapshot

RATES = (0.7, 0.5, 0.3)


@pytest.fixture
def clock():
    return [1000.0]


def facts(**over) -> EngineFacts:
    return dataclasses.replace(ENGINE, **over)


def refused_with_one_line(path, clock, caplog, engine, needle):
    """The controller falls back on ``engine``: one WARNING line with ``needle``, the file untouched,
    and it keeps counting without errors."""
    before = snapshot(path.parent)
    with caplog.at_level(logging.INFO, logger="tabletune.controller"):
        c = fake_controller(path, clock, engine=engine)
    assert c.start is None and c.next_lookup() is None, "the engine's own table stays in force"
    assert needle in c.fallback_reason and str(path) in c.fallback_reason
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "using the engine's configured table [[1,1,0],[2,2,1],[3,3,2],[4,16,3]]" \
        in lines[0] and needle in lines[0], lines
    FakeEngine(c, (0.5, 0.3, 0.1), lambda b, k: 10.0, clock=clock).run(50, 4)
    assert c.steps == 50 and c.errors == 0
    assert snapshot(path.parent) == before
    return c


# -- a file must say which engine it is for ---------------------------------------------------------

def test_a_file_without_identity_is_refused(tmp_path, clock, caplog):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES, identity=None)
    refused_with_one_line(p, clock, caplog, ENGINE, "records no engine identity")


@pytest.mark.parametrize("field", ["model", "method", "vllm_version", "gpu"])
def test_an_identity_lacking_a_field_every_identity_has_is_refused(tmp_path, clock, caplog, field):
    ident = {k: v for k, v in IDENTITY.items() if k != field}
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES, identity=ident)
    refused_with_one_line(p, clock, caplog, ENGINE, f"its identity lacks {field}")


def test_the_same_file_with_its_identity_is_served(tmp_path, clock):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES)
    c = fake_controller(p, clock, engine=facts(gpu="cpu", deployment="test"))
    assert c.start is not None and c.controlling


# -- GPU type ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("file_gpu, engine_gpu_name, ok", [
    ("cpu", "cpu", True),
    ("H200", "NVIDIA H200", True),           # the fleet's label vs the driver's model name
    ("NVIDIA H200", "NVIDIA H200", True),    # engine_identity() records the driver's name
    ("gpu", "NVIDIA H200", True),            # a GPU whose model was not read: any GPU
    ("H200", "NVIDIA H100 80GB HBM3", False),
    ("L40", "NVIDIA L40S", False),
    ("cpu", "NVIDIA H200", False),
    ("H200", "cpu", False),
])
def test_the_gpu_type_is_compared(tmp_path, clock, caplog, file_gpu, engine_gpu_name, ok):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES, identity=dict(IDENTITY, gpu=file_gpu))
    engine = facts(gpu=engine_gpu_name)
    if ok:
        assert fake_controller(p, clock, engine=engine).start is not None
    else:
        refused_with_one_line(p, clock, caplog, engine, f"GPU {file_gpu!r} != this engine's {engine_gpu_name!r}")


def test_an_engine_that_does_not_know_its_gpu_does_not_compare_it(tmp_path, clock):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES, identity=dict(IDENTITY, gpu="H200"))
    assert fake_controller(p, clock, engine=facts(gpu=None)).start is not None


def test_engine_gpu_reads_the_device_type_and_the_driver_files(tmp_path, monkeypatch):
    assert engine_gpu("cpu") == "cpu" and engine_gpu(None) is None and engine_gpu("tpu") is None
    proc = tmp_path / "gpus"
    (proc / "0000:01:00.0").mkdir(parents=True)
    (proc / "0000:01:00.0" / "information").write_text("Model: \t\t NVIDIA H200\nIRQ: 10\n")
    assert nvidia_gpu_name(proc) == "NVIDIA H200"
    assert nvidia_gpu_name(tmp_path / "none") is None
    import tabletune_pipelines.formats.identity_match as im

    monkeypatch.setattr(im, "nvidia_gpu_name", lambda: nvidia_gpu_name(proc))
    assert engine_gpu("cuda") == "NVIDIA H200"


# -- the deployment the engine was told to serve ------------------------------------------------------

def test_a_file_of_another_deployment_is_refused_when_the_engine_names_its_deployment(tmp_path, clock, caplog):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES)  # deployment "test"
    c = refused_with_one_line(p, clock, caplog, facts(deployment="h200-qwen"),
                              f"was published for deployment 'test', but this engine serves 'h200-qwen' "
                              f"({DEPLOYMENT_ENV})")
    assert "published_table of 'h200-qwen'" in c.fallback_reason


def test_without_a_configured_deployment_the_name_is_not_checked(tmp_path, clock):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES)
    assert fake_controller(p, clock, engine=facts(deployment=None)).start is not None


# -- while serving -----------------------------------------------------------------------------------

def test_a_newer_version_without_identity_is_ignored_while_serving(tmp_path, clock, caplog):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES)
    c = fake_controller(p, clock)
    eng = FakeEngine(c, RATES, lambda b, k: 10.0, clock=clock)
    eng.run(10, 4)
    publish(p, ranges=[(1, 16, 1)], rates=RATES, version=2, identity=None)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tabletune.controller"):
        eng.run(300, 4)  # 3 s of polls: read once, refused once
    assert c.start.published.version == 1 and c.ranges == ((1, 16, 3),) and c.errors == 0
    lines = [r.getMessage() for r in caplog.records if "not using the changed published file" in r.getMessage()]
    assert len(lines) == 1 and "records no engine identity" in lines[0]
    assert {k: v for k, v in snapshot(tmp_path).items() if k == "pub.json"} == \
        {k: v for k, v in before.items() if k == "pub.json"}


# -- the adapter reads what it compares ------------------------------------------------------------

def test_the_adapter_reads_the_device_type_and_the_deployment(monkeypatch):
    pytest.importorskip("vllm")
    from tabletune_pipelines.controller import scheduler as adapter

    spec = types.SimpleNamespace(method="draft_model", model="/m/draft",
                                 num_speculative_tokens_per_batch_size=[list(r) for r in LAUNCH])
    cfg = types.SimpleNamespace(speculative_config=spec, model_config=types.SimpleNamespace(model="/m/target"),
                                device_config=types.SimpleNamespace(device_type="cpu"),
                                scheduler_config=types.SimpleNamespace(max_num_seqs=16))
    sched = types.SimpleNamespace(vllm_config=cfg, num_spec_tokens=3, scheduler_config=cfg.scheduler_config)
    monkeypatch.delenv(DEPLOYMENT_ENV, raising=False)
    f = adapter.engine_facts(sched)
    assert f.gpu == "cpu" and f.deployment is None
    monkeypatch.setenv(DEPLOYMENT_ENV, "local-cpu")
    assert adapter.engine_facts(sched).deployment == "local-cpu"


# -- one comparison: the library and the controller agree ---------------------------------------------

BASE = EngineIdentity(gpu="H200", vllm_version="0.26.0", model="/models/qwen3-4b", drafter="/models/eagle3",
                      method="eagle3", max_k=3, max_num_seqs=128)
OTHERS = {
    "same": {},
    "other gpu": {"gpu": "H100"},
    "other model": {"model": "/models/qwen3-8b"},
    "other drafter": {"drafter": "/models/other-head"},
    "other method": {"method": "draft_model"},
    "other K": {"max_k": 4},
    "other max_num_seqs": {"max_num_seqs": 64},
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_the_library_and_the_controller_use_one_comparison(tmp_path, case):
    other = dataclasses.replace(BASE, **OTHERS[case])
    dep = types.SimpleNamespace(**{f: getattr(BASE, f) for f in ("gpu", "model", "drafter", "method", "max_k",
                                                                 "max_num_seqs")})
    library = same_engine(dep, other)
    # The controller: a file of ``other`` on an engine that runs BASE (it knows every field, as on a GPU).
    n, k = other.max_num_seqs, other.max_k
    p = publish(tmp_path / "pub.json", ranges=[(1, n, k)], rates=(0.7, 0.5, 0.3, 0.2)[:k],
                identity={f: v for f, v in other.to_dict().items() if f not in ("schema", "schema_version")},
                n=n, k_max=k, profile={})
    engine = EngineFacts(max_k=BASE.max_k, max_num_seqs=BASE.max_num_seqs, launch_ranges=None, model=BASE.model,
                         method=BASE.method, drafter=BASE.drafter, vllm_version=BASE.vllm_version, gpu="NVIDIA H200")
    controller_accepts = not isinstance(load_start(p, engine), str)
    assert library == controller_accepts == (case == "same")
    assert bool(identity_mismatches(other.to_dict(), BASE.to_dict())) == (case != "same")


@pytest.mark.parametrize("here, ok", [("0.26.0", True), ("0.26.0+cu128", True), ("0.26.1", False)])
def test_the_vllm_here_is_compared_like_the_controller_compares_a_file(tmp_path, monkeypatch, here, ok):
    """One rule for the vLLM version (``identity_match``: the same public version): a measurement's
    check of the vLLM installed here (``deployments.check_local_engine``) and the controller on a file
    made on BASE agree."""
    from tabletune_pipelines.tuning import deployments
    from tabletune_pipelines.errors import EngineMismatchError

    monkeypatch.setattr(deployments, "installed_vllm_version", lambda: here)
    try:
        deployments.check_local_engine(BASE)
        library = True
    except EngineMismatchError:
        library = False
    n, k = BASE.max_num_seqs, BASE.max_k
    p = publish(tmp_path / "pub.json", ranges=[(1, n, k)], rates=RATES,
                identity={f: v for f, v in BASE.to_dict().items() if f not in ("schema", "schema_version")},
                n=n, k_max=k, profile={})
    engine = EngineFacts(max_k=k, max_num_seqs=n, launch_ranges=None, model=BASE.model, method=BASE.method,
                         drafter=BASE.drafter, vllm_version=here, gpu="NVIDIA H200")
    controller_accepts = not isinstance(load_start(p, engine), str)
    assert library == controller_accepts == ok


def test_same_gpu_rules():
    assert same_gpu("H200", "NVIDIA H200 NVL") and same_gpu("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB")
    assert not same_gpu("H100-SXM", "NVIDIA H100 80GB HBM3")  # a label with words the driver lacks: refused
    assert same_gpu("CPU", "cpu") and not same_gpu("cpu", "gpu")


def test_without_a_configured_deployment_the_files_deployment_is_logged(tmp_path, clock, caplog):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=RATES)  # deployment "test"
    start = load_start(p, facts(deployment=None))
    assert not isinstance(start, str)
    (note,) = [n for n in start.notes if "deployment" in n]
    assert note.startswith("it was published for deployment 'test'; this engine was not told which deployment")
    assert f"set {DEPLOYMENT_ENV}=<deployment> to have it refused" in note
    with caplog.at_level(logging.INFO, logger="tabletune.controller"):
        c = fake_controller(p, clock, engine=facts(deployment=None))
    assert c.start is not None
    assert sum("published for deployment 'test'" in r.getMessage() for r in caplog.records) == 1
    named = load_start(p, facts(deployment="test"))  # told, and the file is its own: no note
    assert not isinstance(named, str) and not any("deployment" in n for n in named.notes)
