"""The default model dtype: bfloat16 on a GPU and on a CPU with native bf16, float32 elsewhere;
the engine identity names the dtype used (docs/engine-facts.md, "CPU build: the dtype")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.dtype import OVERRIDE_ENV, choose_dtype, cpu_flags, default_dtype
from tabletune_pipelines.engine.identity import deployment_identity, engine_identity
from tabletune_pipelines.errors import EngineConfigError

# /proc/cpuinfo of the two kinds of machine (abridged): an AMD EPYC with AVX2 only, a Sapphire Rapids.
AVX2_EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2\n"
SPR = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile\n"
AMX_ONLY = "flags\t: avx2 amx_bf16 amx_tile\n"


def test_cpu_flags_are_read_from_cpuinfo_text():
    assert {"avx2", "fma"} <= cpu_flags(AVX2_EPYC) and "avx512_bf16" not in cpu_flags(AVX2_EPYC)
    assert cpu_flags("Features\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}  # arm64 names the line Features
    assert cpu_flags("no flags here") == frozenset()


@pytest.mark.parametrize("text, dtype, named", [
    (AVX2_EPYC, "float32", "no native bf16"),
    (SPR, "bfloat16", "amx_bf16, avx512_bf16"),
    (AMX_ONLY, "bfloat16", "amx_bf16"),
    ("flags\t: avx512f avx512bw\n", "float32", "no native bf16"),  # AVX-512 without its bf16 extension
])
def test_the_cpu_decides(text, dtype, named):
    choice = choose_dtype("cpu", flags=cpu_flags(text), override="")
    assert choice.dtype == dtype and named in choice.reason


def test_gpu_is_bfloat16_and_the_override_wins_on_cpu():
    assert choose_dtype("gpu", flags=frozenset(), override="0").dtype == "bfloat16"
    assert choose_dtype("cpu", flags=cpu_flags(SPR), override="0").dtype == "float32"
    assert choose_dtype("cpu", flags=cpu_flags(AVX2_EPYC), override="1").dtype == "bfloat16"
    assert OVERRIDE_ENV in choose_dtype("cpu", flags=frozenset(), override="0").reason
    with pytest.raises(EngineConfigError, match="TABLETUNE_CPU_BF16 = 'yes'"):
        choose_dtype("cpu", flags=frozenset(), override="yes")
    with pytest.raises(EngineConfigError, match="device = 'tpu'"):
        choose_dtype("tpu")


def _dep(**kw):
    base = {"gpu": "cpu", "model": "tiny:small", "drafter": None, "method": "ngram", "max_k": 3, "max_num_seqs": 16,
            "dtype": None, "cudagraph_mode": None, "model_runner": "auto"}
    return SimpleNamespace(**{**base, **kw})


def test_the_identity_records_the_dtype_used_so_the_two_kinds_of_cpu_never_mix(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    avx2 = deployment_identity(_dep(), "0.32.0+cpu")
    cfg = engine_identity(ServerConfig(model="/m", method="ngram", num_speculative_tokens=3, device="cpu"),
                          vllm_version="0.32.0+cpu")
    assert avx2.dtype == cfg.dtype == default_dtype("cpu") == "float32"
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    bf16 = deployment_identity(_dep(), "0.32.0+cpu")
    assert bf16.dtype == "bfloat16" and bf16.key != avx2.key
    # A fleet dtype overrides the decision on either kind of CPU; a GPU deployment is bfloat16.
    assert deployment_identity(_dep(dtype="float32"), "0.32.0+cpu").key == avx2.key
    assert deployment_identity(_dep(gpu="H200"), "0.26.0").dtype == "bfloat16"
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert deployment_identity(_dep(gpu="H200"), "0.26.0").dtype == "bfloat16"


def test_a_launch_without_a_dtype_gets_the_device_default(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert ServerConfig(model="/m", device="cpu").dtype == "float32"
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    assert ServerConfig(model="/m", device="cpu").dtype == "bfloat16"
    assert ServerConfig(model="/m", device="cpu", dtype="float32").dtype == "float32"
    from tabletune_pipelines.engine.command import build_command

    assert "--dtype" in (argv := build_command(ServerConfig(model="/m", device="cpu"), 8000, "cpu")) and \
        argv[argv.index("--dtype") + 1] == "bfloat16"
