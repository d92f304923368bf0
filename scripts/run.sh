#!/usr/bin/env bash
# Set everything up (if needed) and run the main job on the embedded default: the whole Dagster
# pipeline on real vLLM (CPU build) with a real model (SmolLM2-135M-Instruct, converted once by
# setup) and n-gram drafting, on a sample week of real prompts (HumanEval code + WritingBench prose).
# Extra arguments go to `tabletune run` (--quick, --week YYYY-MM-DD, --mix code:0.5,prose:0.5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tabletune run "$@"
