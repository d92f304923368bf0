#!/usr/bin/env bash
# Set everything up (if needed) and run the whole test suite, engine and Dagster tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian packages the tests drive: headless Chromium (the Dagster UI test, the Prometheus graph's
# screenshot) and Prometheus with promtool (the controller's metrics tests; never started as a
# service: the tests run their own on a free port). No browser or binary downloads here.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[test] installing Debian's ${missing[*]} for the UI and metrics tests"
    # prometheus without its recommends (exporters that would come as services)
    (apt-get update -qq && for p in "${missing[@]}"; do
       if [ "$p" = prometheus ]; then flags=(--no-install-recommends); else flags=(); fi
       DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${flags[@]}" "$p" >/dev/null || exit 1
     done) || echo "[test] could not install ${missing[*]}; the tests that need them fail with an install hint"
  else
    echo "[test] missing: sudo apt-get install -y ${missing[*]} (the UI and metrics tests need them)"
  fi
fi
exec .venv/bin/python -m pytest "$@"
