#!/usr/bin/env bash
# Set everything up (if needed) and run the main job on the embedded default: the whole Dagster
# pipeline on real vLLM (CPU build) with tiny local models. Extra arguments go to `tabletune run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tabletune run "$@"
