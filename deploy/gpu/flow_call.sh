#!/usr/bin/env bash
# One device call's worth of the tuning flow on the GPU machine, inside a deadline (a call may run 600 s):
#   source .gpu/setup.sh; [WARM_START=0] bash deploy/gpu/flow_call.sh dense|moe DEADLINE_S [gpu_flow.py args...]
# Installs the carried duckdb wheel (h200.sh prep), runs the flow in one launch (h200.sh flow) with what
# is left of the deadline, then, if 90 s remain, the engine's warm start (h200.sh start: its compile
# caches are under the home now). WARM_START=0 gives the flow the whole deadline (less 10 s) and skips
# the warm start. Logs and result files land in $OUT/<engine>/.
set -uo pipefail
e=$1; deadline=$2; shift 2
t0=$(date +%s)
left() { echo $(( deadline - ($(date +%s) - t0) )); }
mkdir -p "${OUT:-/tmp/out}/$e"
bash deploy/gpu/h200.sh prep
export PYTHONUNBUFFERED=1
reserve=$([ "${WARM_START:-1}" = 0 ] && echo 10 || echo 95)
timeout $(( $(left) - reserve )) bash deploy/gpu/h200.sh flow "$e" "$@" > "${OUT:-/tmp/out}/$e/stdout.log" 2>&1
echo "[flow_call] flow rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "\[flow\]|stopped per batch|rounds stopped|\[served\] load|one launch of|UNVERIFIED|verified|refus|Error|error|switch" \
  "${OUT:-/tmp/out}/$e/stdout.log" | grep -v "^\s*$" | tail -60
if [ "${WARM_START:-1}" != 0 ] && [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 5 )) bash deploy/gpu/h200.sh start "$e" 2>&1 | grep -E "startup_s|Error" | tail -3
fi
echo "[flow_call] done after $(( $(date +%s) - t0 )) s"
