#!/usr/bin/env bash
# Set everything up (if needed) and run the whole test suite, engine and Dagster tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Dagster UI test drives headless Chromium (Debian's package; no browser downloads here).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "[test] installing Debian's chromium for the UI test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "[test] could not install chromium; the UI test will fail with an install hint"
  else
    echo "[test] chromium missing: sudo apt-get install -y chromium (the UI test needs it)"
  fi
fi
exec .venv/bin/python -m pytest "$@"
