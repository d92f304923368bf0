"""Engine package tests that start no server: config validation, up-front checks, device
selection, the CPU synthetic rejection path, step analysis, metrics parsing, prompt files."""

from __future__ import annotations

import json
import socket

import pytest

from tabletune_pipelines.engine.acceptance import (
    load_prompts,
    parse_spec_counters,
    prompt_fingerprint,
    rates_from_counts,
    sample_prompts,
)
from tabletune_pipelines.engine.errors import (
    EngineConfigError,
    ModelNotFoundError,
    PortInUseError,
    PromptFileError,
    VocabMismatchError,
)
from tabletune_pipelines.engine.profiler import _rotations, analyse_steps
from tabletune_pipelines.engine.server import (
    ServerConfig,
    VLLMServer,
    build_command,
    build_env,
    check_config,
    resolve_device,
)
from tabletune_pipelines.errors import TableTuneError


def _model_dir(tmp_path, name: str, vocab: int):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": vocab, "architectures": ["LlamaForCausalLM"]}))
    return d


# ----------------------------------------------------------------------------- config
def test_config_validation_names_the_bad_value():
    with pytest.raises(EngineConfigError, match="num_speculative_tokens = 0"):
        ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=0)
    with pytest.raises(EngineConfigError, match="method = 'medusa2'"):
        ServerConfig(model="/m", method="medusa2", num_speculative_tokens=2)
    with pytest.raises(EngineConfigError, match="a_2 = 0.6"):
        ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=2,
                     synthetic_acceptance_rates=(0.5, 0.6))
    with pytest.raises(EngineConfigError, match="has 1 entries"):
        ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=2,
                     synthetic_acceptance_rates=(0.5,))
    with pytest.raises(EngineConfigError, match="table"):
        ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=2, table=((2, 8, 1),))
    with pytest.raises(EngineConfigError, match="device = 'tpu'"):
        ServerConfig(model="/m", device="tpu")
    with pytest.raises(EngineConfigError, match="max_num_seqs = 0"):
        ServerConfig(model="/m", max_num_seqs=0)
    with pytest.raises(EngineConfigError, match="drafter = None"):
        ServerConfig(model="/m", method="draft_model", num_speculative_tokens=2)
    with pytest.raises(EngineConfigError, match="needs a speculative method"):
        ServerConfig(model="/m", num_speculative_tokens=2)
    assert issubclass(EngineConfigError, TableTuneError)


def test_missing_model_path(tmp_path):
    cfg = ServerConfig(model=str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="nope"):
        VLLMServer(cfg).start()
    d = _model_dir(tmp_path, "t", 100)
    cfg = ServerConfig(model=str(d), drafter=str(tmp_path / "no-draft"), method="draft_model", num_speculative_tokens=2)
    with pytest.raises(ModelNotFoundError, match="drafter"):
        check_config(cfg)


def test_vocab_mismatch(tmp_path):
    t = _model_dir(tmp_path, "t", 2048)
    d = _model_dir(tmp_path, "d", 1000)
    cfg = ServerConfig(model=str(t), drafter=str(d), method="draft_model", num_speculative_tokens=2)
    with pytest.raises(VocabMismatchError, match="vocab_size 1000 but target .* has 2048"):
        VLLMServer(cfg).start()


def test_port_taken(tmp_path):
    t = _model_dir(tmp_path, "t", 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port = {port}"):
            VLLMServer(ServerConfig(model=str(t), port=port)).start()


# ----------------------------------------------------------------------------- device selection
def test_device_selection_without_gpu(tmp_path):
    assert resolve_device("auto", cpu_build=True) == "cpu"
    assert resolve_device("auto", cpu_build=False) == "gpu"
    assert resolve_device("gpu", cpu_build=True) == "gpu"
    cfg = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                       table=((1, 16, 3),), enforce_eager=False, enable_prefix_caching=True)
    gpu = build_command(cfg, 8000, "gpu")
    assert "tabletune_pipelines.engine.launcher" not in gpu
    assert gpu[gpu.index("serve") - 1].endswith("vllm") or gpu[:3][-1] == "vllm.entrypoints.cli.main"
    assert "--enforce-eager" not in gpu and "--no-enable-prefix-caching" not in gpu
    assert "tabletune_pipelines.engine.step_scheduler.AutoTimingScheduler" in gpu
    # speculative_extra cannot override what the typed fields control (e.g. a serving table).
    with pytest.raises(EngineConfigError, match="num_speculative_tokens_per_batch_size"):
        ServerConfig(model="/m", method="ngram", num_speculative_tokens=3,
                     speculative_extra={"num_speculative_tokens_per_batch_size": [[1, 16, 1]]})
    # Defaults: GPU timing keeps production's CUDA graphs; the CPU build is always eager.
    default = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3)
    assert "--enforce-eager" not in build_command(default, 8000, "gpu")
    assert "--enforce-eager" in build_command(default, 8000, "cpu")
    cpu = build_command(cfg, 8000, "cpu")
    assert cpu[1:3] == ["-m", "tabletune_pipelines.engine.launcher"]
    assert "--enforce-eager" in cpu and "--no-enable-prefix-caching" in cpu
    assert "tabletune_pipelines.engine.step_scheduler.TimingScheduler" in cpu
    spec = json.loads(cpu[cpu.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 16, 3]]
    env_gpu = build_env(cfg, "gpu", tmp_path, tmp_path / "s", tmp_path / "c")
    env_cpu = build_env(cfg, "cpu", tmp_path, tmp_path / "s", tmp_path / "c")
    for var in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "VLLM_CACHE_ROOT"):
        assert var in env_cpu
    assert env_cpu["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env_gpu or env_gpu["VLLM_CPU_KVCACHE_SPACE"] == __import__("os").environ.get("VLLM_CPU_KVCACHE_SPACE")


def test_auto_scheduler_picks_async_or_sync(monkeypatch):
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from tabletune_pipelines.engine import step_scheduler as ss

    made = []
    monkeypatch.setattr(ss.TimingScheduler, "__init__", lambda self, *a, **k: made.append("sync"))
    monkeypatch.setattr(ss.TimingAsyncScheduler, "__init__", lambda self, *a, **k: made.append("async"))
    on = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True))
    off = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    assert isinstance(ss.AutoTimingScheduler(vllm_config=on, kv_cache_config=None), ss.TimingAsyncScheduler)
    assert isinstance(ss.AutoTimingScheduler(vllm_config=off, kv_cache_config=None), ss.TimingScheduler)
    assert made == ["async", "sync"]


def test_launcher_version_shim_only_on_cpu_build(monkeypatch):
    import importlib.metadata as md

    from tabletune_pipelines.engine import launcher

    real = md.version
    calls = {}

    def fake_version(name):
        calls[name] = calls.get(name, 0) + 1
        if name == "vllm":
            raise md.PackageNotFoundError(name)
        if name == "vllm-cpu":
            return "0.32.0"
        return real(name)

    monkeypatch.setattr(md, "version", fake_version)
    assert launcher.install_version_shim() is True
    assert md.version("vllm") == "0.32.0+cpu"
    monkeypatch.setattr(md, "version", lambda name: "0.26.0")
    assert launcher.install_version_shim() is False  # GPU vLLM: nothing to do


# ----------------------------------------------------------------------------- synthetic rejection
torch = pytest.importorskip("torch")


def _batch(B=64, S=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.arange(1, B + 1, dtype=torch.int32) * S
    draft = torch.randint(3, 2000, (B * S,), generator=g, dtype=torch.int32)
    target = torch.randint(3, 2000, (B * S,), generator=g)
    bonus = torch.randint(3, 2000, (B, 1), generator=g)
    u = torch.rand(B * S, generator=g, dtype=torch.float64)
    out = torch.full((B, S + 1), -1, dtype=torch.int32)
    return out, cu, draft, target, bonus, u


def test_synthetic_zero_rates_reject_everything():
    from tabletune_pipelines.engine.cpu_plugin import synthetic_rejection

    out, cu, draft, target, bonus, u = _batch()
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, torch.zeros(3))
    assert torch.equal(out[:, 0].long(), target.view(-1, 3)[:, 0])
    assert (out[:, 1:] == -1).all()


def test_synthetic_one_rates_accept_everything_with_bonus():
    from tabletune_pipelines.engine.cpu_plugin import synthetic_rejection

    out, cu, draft, target, bonus, u = _batch()
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, torch.ones(3))
    assert torch.equal(out[:, :3], draft.view(-1, 3))
    assert torch.equal(out[:, 3].long(), bonus.view(-1))


def test_synthetic_rates_statistics_and_row_mask():
    from tabletune_pipelines.engine.cpu_plugin import _conditional, synthetic_rejection

    B = 20000
    out, cu, draft, target, bonus, u = _batch(B=B, seed=3)
    cond = torch.tensor(_conditional([0.7, 0.5, 0.3]), dtype=torch.float32)
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, cond)
    kept = (out[:, :3] == draft.view(-1, 3)).int().cumprod(1).sum(1)
    for i, want in enumerate((0.7, 0.5, 0.3), start=1):
        assert abs((kept >= i).float().mean().item() - want) < 0.02
    # Rows outside the mask are untouched; zero-draft rows get the bonus token.
    out2 = torch.full((2, 4), -1, dtype=torch.int32)
    synthetic_rejection(out2, torch.tensor([0, 0]), torch.tensor([], dtype=torch.int32),
                        torch.tensor([], dtype=torch.long), torch.tensor([[7], [8]]), torch.tensor([True, False]),
                        3, torch.rand(0, dtype=torch.float64), torch.zeros(3))
    assert out2.tolist() == [[7, -1, -1, -1], [-1, -1, -1, -1]]


def test_plugin_register_is_noop_off_cpu_build(monkeypatch):
    from tabletune_pipelines.engine import cpu_plugin

    monkeypatch.setattr(cpu_plugin, "is_cpu_build", lambda: False)
    cpu_plugin.register()  # nothing to patch, must not raise

    def boom():
        raise RuntimeError("broken vllm")

    monkeypatch.setattr(cpu_plugin, "is_cpu_build", boom)
    cpu_plugin.register()  # errors are logged, never raised


# ----------------------------------------------------------------------------- step analysis
def test_analyse_steps_filters_batch_and_detects_late_admission():
    steps = [{"b": 1, "new": 1, "dt": 30.0, "d": 0, "k": 1}, {"b": 4, "new": 3, "dt": 25.0, "d": 1, "k": 1}]
    steps += [{"b": 4, "new": 0, "dt": 5.0 + i * 0.01, "d": 4, "k": 1} for i in range(10)]
    intervals, together = analyse_steps(steps, 4, 1)
    assert not together
    assert len(intervals) == 10 and min(intervals) >= 5.0
    steps = [{"b": 4, "new": 4, "dt": 30.0, "d": 0}] + [{"b": 4, "new": 0, "dt": 6.0, "d": 0} for _ in range(5)]
    intervals, together = analyse_steps(steps, 4, None)
    assert together and intervals == [6.0] * 5


def test_k_order_rotates_across_repetitions():
    assert _rotations([0, 1, 3], 3) == [[0, 1, 3], [1, 3, 0], [3, 0, 1]]


def test_fixed_k_mode_launches_k_without_table(tmp_path):
    """mode="fixed_k": one launch per k >= 1 with num_speculative_tokens = k and no table; cells carry
    launch_k = k (what the engine_dependence_trap check reads), are handed to on_cell, and resume."""
    from tabletune_pipelines.engine.profiler import ProfilePlan, profile_step_times
    from tabletune_pipelines.documents import EngineIdentity

    launched, stopped = [], []

    class FakeServer:
        def __init__(self, cfg):
            self.config, self.startup_seconds, self.log_path, self._b = cfg, 0.0, "fake.log", 1
            launched.append(cfg)

        def start(self):
            return self

        def stop(self):
            stopped.append(self.config.num_speculative_tokens)

        def arm_gate(self, n):
            pass

        def complete(self, prompts, max_tokens, **kw):
            self._b = len(prompts)
            return {"choices": [{}] * len(prompts)}

        def step_log_offset(self):
            return 0

        def read_steps(self, since=None, until=None, offset=0):
            b, k = self._b, self.config.num_speculative_tokens
            return [{"b": b, "new": b, "dt": 9.0, "d": 0, "k": k}] + [
                {"b": b, "new": 0, "dt": 4.0 + k + b / 10, "d": b * k, "k": k} for _ in range(20)]

        def set_k(self, *a, **kw):
            raise AssertionError("fixed_k launches have no table: k must not be switched")

        def log_tail(self, n=40):
            return ""

    cfg = ServerConfig(model=str(tmp_path), drafter=str(tmp_path), method="draft_model", num_speculative_tokens=3,
                       table=((1, 8, 3),), synthetic_acceptance_rates=(0.7, 0.5, 0.3), max_num_seqs=8)
    ident = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="m", drafter="d", method="draft_model",
                           max_k=3, max_num_seqs=8)
    plan = ProfilePlan(batch_sizes=(1, 8), ks=(0, 1, 3), repetitions=2, accept_batch_sizes=(1,))
    assert plan.cells("fixed_k") == [(1, 1, "reject"), (3, 1, "reject"), (1, 8, "reject"), (3, 8, "reject")]
    got = []
    prof = profile_step_times(cfg, plan=plan, mode="fixed_k", identity=ident, vocab_size=100, warmup=False,
                              server_factory=FakeServer, on_cell=got.append, progress=lambda m: None)
    assert [(c.num_speculative_tokens, c.table, c.synthetic_acceptance_rates) for c in launched] == [
        (1, None, (0.0,)), (3, None, (0.0, 0.0, 0.0))]
    assert stopped == [1, 3]
    assert prof.mode == "fixed_k" and len(got) == 4
    assert all(c.k >= 1 and c.acceptance == "reject" and c.launch_k == c.k and c.timing == "engine" for c in got)
    assert prof.reject_cells() == {1: {1: 5.1, 8: 5.8}, 3: {1: 7.1, 8: 7.8}}
    # A rerun with the cells already measured launches nothing.
    launched.clear()
    profile_step_times(cfg, plan=plan, mode="fixed_k", identity=ident, vocab_size=100, existing=got,
                       server_factory=FakeServer, progress=lambda m: None)
    assert launched == []
    with pytest.raises(EngineConfigError, match="fixed_k"):
        profile_step_times(cfg, plan=ProfilePlan(batch_sizes=(1,), ks=(0,)), mode="fixed_k", identity=ident,
                           vocab_size=100, server_factory=FakeServer)


# ----------------------------------------------------------------------------- metrics + prompts
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="1"} 1.7e9
"""


def test_parse_spec_counters_and_rates():
    c = parse_spec_counters(METRICS)
    assert c.num_drafts == 100 and c.accepted_per_pos == (70.0, 50.0, 30.0)
    assert rates_from_counts(c.accepted_per_pos, [c.num_drafts] * 3) == (0.7, 0.5, 0.3)
    with pytest.raises(TableTuneError, match="no vllm:spec_decode"):
        parse_spec_counters("vllm:num_requests_running 0\n")


def test_prompt_file_errors_name_the_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(p)
    p.write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    with pytest.raises(PromptFileError, match=r"p\.jsonl:2: not valid JSON"):
        load_prompts(p)
    p.write_text('{"prompt": "a"}\n\n["x"]\n')
    with pytest.raises(PromptFileError, match=r":3: expected a JSON object"):
        load_prompts(p)
    p.write_text('{"text": "a"}\n')
    with pytest.raises(PromptFileError, match=r':1: object has no "prompt" key'):
        load_prompts(p)
    p.write_text('{"prompt": ""}\n')
    with pytest.raises(PromptFileError, match=r":1: \"prompt\" must be a non-empty string"):
        load_prompts(p)
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    p.write_text('{"prompt": "a", "id": 1}\n\n{"prompt": "b"}\n')
    assert load_prompts(p) == ["a", "b"]


def test_sampling_is_seeded_and_fingerprint_hides_prompts():
    prompts = [f"prompt {i}" for i in range(500)]
    a = sample_prompts(prompts, 160, seed=0)
    assert a == sample_prompts(prompts, 160, seed=0) and len(a) == 160
    assert a != sample_prompts(prompts, 160, seed=1)
    fp = prompt_fingerprint(a)
    assert len(fp) == 64 and "prompt" not in fp
    assert prompt_fingerprint(["ab", "c"]) != prompt_fingerprint(["a", "bc"])


# ----------------------------------------------------------------------------- tiny models
def test_tiny_models_deterministic_and_rebuilt_when_half_built(tmp_path):
    pytest.importorskip("transformers")
    from tabletune_pipelines.engine.tiny_models import MARKER, ensure_tiny_models, read_vocab_size

    a = ensure_tiny_models(tmp_path / "a", "small")
    b = ensure_tiny_models(tmp_path / "b", "small")
    assert a.vocab_size == b.vocab_size == read_vocab_size(a.target_dir) == read_vocab_size(a.draft_dir)
    for sub in ("target", "draft"):
        assert (getattr(a, f"{sub}_dir") / "model.safetensors").read_bytes() == \
            (getattr(b, f"{sub}_dir") / "model.safetensors").read_bytes()
    assert (a.target_dir / "tokenizer.json").read_bytes() == (a.draft_dir / "tokenizer.json").read_bytes()
    # Reused as is when the marker exists.
    mtime = (a.target_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_models(tmp_path / "a", "small").target_dir == a.target_dir
    assert (a.target_dir / "model.safetensors").stat().st_mtime_ns == mtime
    # No marker (crash mid-build) → rebuilt.
    (a.root / MARKER).unlink()
    (a.target_dir / "model.safetensors").write_bytes(b"garbage")
    c = ensure_tiny_models(tmp_path / "a", "small")
    assert (c.target_dir / "model.safetensors").read_bytes() == (b.target_dir / "model.safetensors").read_bytes()
    with pytest.raises(EngineConfigError, match="size = 'huge'"):
        ensure_tiny_models(tmp_path / "a", "huge")


# ----------------------------------------------------------------------------- step scheduler logic
def test_step_scheduler_control_gate_and_records(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from tabletune_pipelines.engine import step_scheduler as ss
    from tabletune_pipelines.engine.server import _write_distinct

    ctl = tmp_path / "ctl.json"
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv(ss.K_CONTROL_ENV, str(ctl))
    monkeypatch.setenv(ss.STEP_LOG_ENV, str(log))

    class Fake(ss._TimingMixin):
        num_spec_tokens = 3
        scheduler_config = SimpleNamespace(max_num_seqs=8)
        dynamic_sd_lookup = [0] + [3] * 8

    f = Fake()
    f._tt_init()
    added = []
    sig = _write_distinct(ctl, json.dumps({"seq": 1, "k": 1}), None)
    f._tt_poll_control()
    assert f.dynamic_sd_lookup[1:] == [1] * 8
    assert json.loads((tmp_path / "ctl.json.ack").read_text())["ack"] == 1
    # Gate: hold 3 requests, admit them together.
    _write_distinct(ctl, json.dumps({"seq": 2, "gate": 3}), sig)
    for i in range(3):
        f._tt_add_request(SimpleNamespace(request_id=str(i)), added.append)
        assert len(added) == (0 if i < 2 else 3)
    f._tt_add_request(SimpleNamespace(request_id="x"), added.append)  # gate is one-shot
    assert [r.request_id for r in added] == ["0", "1", "2", "x"]
    # A malformed command never raises; it is acknowledged with an error.
    ctl.write_text("{not json")
    f._tt_update(SimpleNamespace(num_scheduled_tokens={}, scheduled_spec_decode_tokens={}), None)
    assert "error" in json.loads((tmp_path / "ctl.json.ack").read_text())
    # One record per step with drafted/kept counts per position.
    so = SimpleNamespace(num_scheduled_tokens={"a": 4, "b": 4}, scheduled_spec_decode_tokens={"a": [1, 2, 3], "b": [4, 5, 6]},
                         num_spec_tokens_to_schedule=3, scheduled_new_reqs=[], total_num_scheduled_tokens=8)
    mro = SimpleNamespace(req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[9, 9, 9], [9]])
    f._tt_update(so, mro)
    f._tt_update(so, mro)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert recs[-1]["b"] == 2 and recs[-1]["d"] == 6 and recs[-1]["a"] == 2
    assert recs[-1]["dp"] == [2, 2, 2] and recs[-1]["ap"] == [1, 1, 0]
    assert recs[-1]["dt"] is not None and recs[-1]["dt"] >= 0
    # Broken inputs are swallowed (never crash the engine).
    f._tt_update(None, None)
