"""Tiny local models: deterministic, rebuilt when half built, vocabulary read back."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.engine.tiny_models import MARKER, ensure_tiny_models, read_vocab_size
from tabletune_pipelines.errors import EngineConfigError


def test_read_vocab_size(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7}}))
    assert read_vocab_size(tmp_path) == 7
    assert read_vocab_size(tmp_path / "missing") is None


def test_unknown_size():
    with pytest.raises(EngineConfigError, match="size = 'huge'"):
        ensure_tiny_models("/nonexistent-tabletune", "huge")


def test_tiny_models_deterministic_and_rebuilt_when_half_built(tmp_path):
    pytest.importorskip("transformers")
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
    # No marker (crash mid-build) -> rebuilt.
    (a.root / MARKER).unlink()
    (a.target_dir / "model.safetensors").write_bytes(b"garbage")
    c = ensure_tiny_models(tmp_path / "a", "small")
    assert (c.target_dir / "model.safetensors").read_bytes() == (b.target_dir / "model.safetensors").read_bytes()


def test_saved_in_the_dtype_launches_use(tmp_path, monkeypatch):
    # vLLM loads the weights without conversion: safetensors and config.json carry the launch dtype,
    # and each dtype has its own folder (the machine's default when none is named).
    pytest.importorskip("transformers")
    from safetensors import safe_open

    monkeypatch.setenv("TABLETUNE_CPU_BF16", "0")
    f32 = ensure_tiny_models(tmp_path, "small")
    bf16 = ensure_tiny_models(tmp_path, "small", "bfloat16")
    assert f32.dtype == "float32" and f32.root != bf16.root and f32.root.name.endswith("-float32")
    for models, torch_name in ((f32, "torch.float32"), (bf16, "torch.bfloat16")):
        assert json.loads((models.target_dir / "config.json").read_text())["torch_dtype"] == models.dtype
        with safe_open(str(models.target_dir / "model.safetensors"), "pt") as f:
            assert {str(f.get_tensor(n).dtype) for n in f.keys()} == {torch_name}
    with pytest.raises(EngineConfigError, match="dtype = 'int8'"):
        ensure_tiny_models(tmp_path, "small", "int8")
