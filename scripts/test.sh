#!/usr/bin/env bash
# Set everything up (if needed) and run the whole test suite, engine and Dagster tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
