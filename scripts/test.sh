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
# With no test selection (no -m, -k, file or node), the suite runs in two phases: the pure-logic
# tests on TABLETUNE_TEST_WORKERS pytest-xdist workers (default 2: one per core; 1 runs them in
# this process), then the tests marked engine or dagster_e2e in one process, one vLLM server at a
# time (a vLLM server keeps both cores busy; tests beside it would only slow it). --junitxml=PATH
# writes the first phase to PATH with "-logic" before ".xml". The status is the worse of the two.
selected=0
for a in "$@"; do
  case "$a" in -m|-m*|-k|-k*|tests*|*.py|*.py::*|-n|-n*|--numprocesses*) selected=1 ;; esac
done
workers="${TABLETUNE_TEST_WORKERS:-2}"
if [ "$selected" = 1 ] || [ "$workers" -le 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
logic=()
for a in "$@"; do
  case "$a" in --junitxml=*.xml) logic+=("${a%.xml}-logic.xml") ;; *) logic+=("$a") ;; esac
done
echo "[test] phase 1: pure-logic tests on $workers workers"
rc1=0
.venv/bin/python -m pytest -n "$workers" -m "not engine and not dagster_e2e" "${logic[@]}" || rc1=$?
echo "[test] phase 2: engine and Dagster end-to-end tests, one process"
rc2=0
.venv/bin/python -m pytest -m "engine or dagster_e2e" "$@" || rc2=$?
echo "[test] phase 1 (pure logic) exited $rc1, phase 2 (engine, Dagster e2e) exited $rc2"
exit $(( rc1 > rc2 ? rc1 : rc2 ))
