"""The graph envelope a launched vLLM reports in its log, checked against the identity's
(``engine.envelope_log``): excerpts of real logs (vLLM 0.26 on an H200, the CPU build of 0.32), a
match, a mismatch, a log that carries no figure, and the capture cost. No vLLM is launched."""

from __future__ import annotations

import dataclasses

import pytest

from tabletune_pipelines.engine.envelope_log import (
    capture_cost,
    check_envelope,
    envelope_checked,
    expected_envelope,
    read_envelope,
)
from tabletune_pipelines.errors import EngineMismatchError
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.identity_match import vllm_capture_ceiling

# vLLM 0.26, H200, the MoE at max_num_seqs 128, K = 3 (benchmarks/data/h200/moe-served-profile-server.log),
# the engine-config line shortened around the fields read.
H200_LOG = """\
(APIServer pid=568) INFO 12-02 01:13:16 [scheduler.py:252] Chunked prefill is enabled with max_num_batched_tokens=8192.
(EngineCore pid=753) INFO 12-02 01:13:36 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: \
model='/tmp/gv/models/qwen3-30b-a3b', speculative_config=SpeculativeConfig(method='eagle3', \
model='/tmp/gv/models/qwen3-30b-a3b-eagle3', num_spec_tokens=3), enforce_eager=False, \
compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'compile_sizes': [], \
'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_num_of_warmups': 1, \
'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 24, 496, 512], 'max_cudagraph_capture_size': 512, \
'local_cache_dir': None}, kernel_config=KernelConfig(moe_backend='auto')
(EngineCore pid=753) INFO 12-02 01:14:42 [gpu_worker.py:560] Available KV cache memory: 69.88 GiB
(EngineCore pid=753) INFO 12-02 01:14:42 [kv_cache_utils.py:2177] GPU KV cache size: 747,680 tokens
(EngineCore pid=753) INFO 12-02 01:15:26 [model_runner.py:747] Graph capturing finished in 44 secs, took 1.52 GiB
"""

# vLLM 0.32, the CPU build (eager: no graphs, no chunked-prefill line).
CPU_LOG = """\
(APIServer pid=30775) WARNING 12-05 13:13:03 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs
(EngineCore pid=440) INFO 12-05 13:13:15 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/tmp/tabletune-tiny-models/small-v2-bfloat16/target', enforce_eager=True, \
compilation_config={'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, \
'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'max_cudagraph_capture_size': None, \
'local_cache_dir': None}, kernel_config=KernelConfig(moe_backend='auto')
"""

H200 = EngineIdentity(gpu="H200", vllm_version="0.26.0", model="/tmp/gv/models/qwen3-30b-a3b",
                      drafter="/tmp/gv/models/qwen3-30b-a3b-eagle3", method="eagle3", max_k=3, max_num_seqs=128,
                      cudagraph_mode="default", capture_ceiling=512)
CPU = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="tiny:small", drafter="tiny:small",
                     method="draft_model", max_k=3, max_num_seqs=16, cudagraph_mode="none")


def test_the_logs_of_both_versions_are_read():
    env = read_envelope(H200_LOG)
    assert (env.config_line, env.cudagraph_mode, env.capture_ceiling, env.graphs, env.max_num_batched_tokens) == \
        (True, "FULL_AND_PIECEWISE", 512, True, 8192)
    cpu = read_envelope(CPU_LOG)
    assert (cpu.config_line, cpu.cudagraph_mode, cpu.capture_ceiling, cpu.graphs, cpu.max_num_batched_tokens) == \
        (True, "NONE", None, False, None)
    zero = read_envelope(H200_LOG.replace("'max_cudagraph_capture_size': 512", "'max_cudagraph_capture_size': 0"))
    assert zero.graphs is False and zero.capture_ceiling is None  # --enforce-eager on a GPU sets it to 0


def test_a_match_passes_and_says_nothing():
    notes = []
    check_envelope(H200, H200_LOG, launch_k=3, max_num_seqs=128, note=notes.append)
    assert notes == []


def test_a_raised_ceiling_that_did_not_reach_the_launch_is_refused_naming_both():
    raised = dataclasses.replace(H200, capture_ceiling=1024)
    with pytest.raises(EngineMismatchError) as exc:
        check_envelope(raised, H200_LOG, launch_k=3, max_num_seqs=128, where="(log x.log)")
    msg = str(exc.value)
    assert "capture ceiling (max_cudagraph_capture_size) 1024 != the server's 512" in msg
    assert raised.key in msg and "x.log" in msg


def test_a_token_budget_other_than_the_identity_s_is_refused():
    pinned = dataclasses.replace(H200, max_num_batched_tokens=4096)
    with pytest.raises(EngineMismatchError, match=r"token budget \(max_num_batched_tokens\) 4096 != the server's 8192"):
        check_envelope(pinned, H200_LOG, launch_k=3, max_num_seqs=128)


def test_a_gpu_identity_on_an_eager_server_is_refused():
    with pytest.raises(EngineMismatchError, match="captures no CUDA graphs"):
        check_envelope(H200, CPU_LOG, launch_k=3, max_num_seqs=128)


def test_where_the_log_carries_no_figure_the_check_is_skipped_with_a_note():
    notes = []
    check_envelope(CPU, CPU_LOG, launch_k=3, max_num_seqs=16, note=notes.append)  # eager: no ceiling to check
    assert notes == ["graph envelope check: the identity records no CUDA graphs: the capture ceiling is not checked"]
    notes.clear()
    check_envelope(dataclasses.replace(CPU, max_num_batched_tokens=2048), CPU_LOG, launch_k=3, max_num_seqs=16,
                   note=notes.append)
    assert any("no max_num_batched_tokens" in n for n in notes)
    notes.clear()
    check_envelope(H200, "no vLLM here\n", launch_k=3, max_num_seqs=128, note=notes.append)
    assert notes == ["graph envelope check: the server log has no 'Initializing a V1 LLM engine' line: the graph "
                     "envelope is not checked"]


def test_vllm_s_rounding_to_its_capture_grid_is_one_envelope():
    assert [vllm_capture_ceiling(c) for c in (1000, 992, 264, 60, 3, 512)] == [992, 992, 256, 56, 2, 512]
    log = H200_LOG.replace("'max_cudagraph_capture_size': 512", "'max_cudagraph_capture_size': 992")
    notes = []
    check_envelope(dataclasses.replace(H200, capture_ceiling=1000), log, launch_k=3, max_num_seqs=128,
                   note=notes.append)
    assert notes == ["graph envelope check: vLLM rounds the capture ceiling 1000 down to its capture grid: it runs 992"]


def test_launches_of_another_shape_expect_vllm_s_rule_at_their_shape_unless_the_identity_pins_a_ceiling():
    # The no-speculation baseline (K = 0) at max_num_seqs 128: min(128·1·2, 512) = 256.
    assert expected_envelope(H200, launch_k=0, max_num_seqs=128)["capture_ceiling"] == 256
    assert expected_envelope(H200, launch_k=3, max_num_seqs=128)["capture_ceiling"] == 512
    pinned = dataclasses.replace(H200, capture_ceiling=1024)
    assert expected_envelope(pinned, launch_k=0, max_num_seqs=128)["capture_ceiling"] == 1024


def test_the_capture_cost_is_read_from_the_launch_log():
    cost = capture_cost(H200_LOG)
    assert (cost.capture_s, cost.graph_gib, cost.kv_cache_gib, cost.kv_cache_tokens) == (44.0, 1.52, 69.88, 747680)
    assert cost.describe() == "capture 44 s, graphs 1.52 GiB, KV cache 69.88 GiB, 747,680 KV tokens"
    none = capture_cost(CPU_LOG)
    assert none.capture_s is None and "not in the launch log" in none.describe()


def test_the_checked_server_stops_a_launch_in_another_envelope(tmp_path, monkeypatch):
    """The factory the measuring paths use: once healthy, the server's log is checked; a mismatch stops it."""
    from tabletune_pipelines.engine import process
    from tabletune_pipelines.engine.config import ServerConfig

    log = tmp_path / "server.log"
    log.write_text(H200_LOG)
    stopped = []
    monkeypatch.setattr(process.VLLMServer, "start", lambda self: self)
    monkeypatch.setattr(process.VLLMServer, "stop", lambda self, timeout=20.0: stopped.append(True))
    monkeypatch.setattr(process.VLLMServer, "log_path", property(lambda self: log))
    cfg = ServerConfig(model=str(tmp_path), drafter=str(tmp_path), method="eagle3", num_speculative_tokens=3,
                       max_num_seqs=128,
                       device="cpu", dtype="float32")
    make = envelope_checked(dataclasses.replace(H200, capture_ceiling=1024))
    with pytest.raises(EngineMismatchError):
        make(cfg).start()
    assert stopped == [True]
    ok = envelope_checked(H200)(cfg).start()
    assert ok.envelope.capture_ceiling == 512
