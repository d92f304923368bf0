#!/usr/bin/env bash
# The (batch size x context) table on the GPU machine, from the project's root after
# `source .gpu/setup.sh` (and `bash deploy/gpu/h200.sh prep` once). One step per call:
#   bash deploy/gpu/context.sh profile dense|moe LEVELS SECONDS   T(B, ctx, k) at LEVELS (e.g. 256,1024,4096),
#                                                                 resumable: a rerun measures what is missing
#   bash deploy/gpu/context.sh table dense|moe RATES             the (B, ctx) table and the batch-only table
#                                                                 (JSON) derived under synthetic rates a_1..a_K
#   bash deploy/gpu/context.sh served dense|moe CONTEXTS LOADS SECONDS [ARGS..]
#                                                                 benchmarks/context_served.py with those tables
# The store lives in /tmp/tt-home (h200.sh); every step leaves its output and the store's export in $OUT.
set -uo pipefail
OUTD=${OUT:-/tmp/out}
mkdir -p "$OUTD"
step=$1; e=$2; shift 2
case "$step" in
  profile)
    levels=$1; secs=$2; shift 2
    timeout "$secs" bash deploy/gpu/h200.sh profile "$e" --context-levels "$levels" "$@" > "$OUTD/profile-$e.log" 2>&1
    echo "[context] profile rc=$? (124: stopped at ${secs} s; rerun to resume)"
    grep -E "context|cells|Error|error" "$OUTD/profile-$e.log" | tail -25
    bash deploy/gpu/h200.sh export "$OUTD/store" > /dev/null 2>&1; ls "$OUTD/store" | head
    ;;
  table)
    rates=$1
    dep=$(case "$e" in dense) echo h200-qwen3-4b-eagle3;; moe) echo h200-qwen3-30b-a3b-eagle3;; esac)
    TABLETUNE_HOME=/tmp/tt-home TABLETUNE_FLEET=${TABLETUNE_FLEET:-deploy/gpu/fleet.h200.yaml} \
      PYTHONPATH=$PWD:/tmp/gv/duck:${PYTHONPATH:-} python3 benchmarks/context_table.py --db /tmp/tt-home/h200.duckdb \
      --deployment "$dep" --rates "$rates" --out /tmp/tt-home/tables-$e.json && cp /tmp/tt-home/tables-$e.json "$OUTD/"
    ;;
  served)
    contexts=$1; loads=$2; secs=$3; shift 3
    grid=$(python3 -c "import json,sys; print(json.dumps(json.load(open('/tmp/tt-home/tables-$e.json'))['grid']))")
    batch=$(python3 -c "import json,sys; print(json.dumps(json.load(open('/tmp/tt-home/tables-$e.json'))['batch']))")
    timeout "$secs" python3 benchmarks/context_served.py --engine "$e" --contexts "$contexts" --loads "$loads" \
      --grid "$grid" --batch "$batch" --out "$OUTD/served-$e" "$@" > "$OUTD/served-$e.log" 2>&1
    echo "[context] served rc=$?"; tail -40 "$OUTD/served-$e.log"
    ;;
esac
