#!/usr/bin/env bash
# Runs on the GPU machine (one H200, vLLM 0.26.0 from the payload, no network), from a copy of the
# project (e.g. .gpu/src = `git archive HEAD`), after `source .gpu/setup.sh`. One step per call:
#   bash deploy/gpu/h200.sh prep                      install the duckdb wheel carried in .gpu/duck (cp312)
#   bash deploy/gpu/h200.sh plan dense|moe ARGS..     the profile's plan (context levels, B, k), nothing launched:
#                                                     runs anywhere, the CPU build too (`profile --dry-run`)
#   bash deploy/gpu/h200.sh profile dense|moe ARGS..  `tabletune profile` on that engine (resumable)
#   bash deploy/gpu/h200.sh table dense|moe RATES     the tuned table (vLLM JSON) for a_1..a_K
#   bash deploy/gpu/h200.sh goodput dense|moe ARGS..  benchmarks/gpu_goodput.py
#   bash deploy/gpu/h200.sh controller dense|moe ARGS..  benchmarks/gpu_controller.py (hook cost, repair)
#   bash deploy/gpu/h200.sh flow dense|moe ARGS..     the whole flow timed: profile, derive, verify, publish
#                                                     in one launch (benchmarks/gpu_flow.py; the store and the
#                                                     published files are copied to $OUT/<engine>/)
#   bash deploy/gpu/h200.sh start dense|moe [--cold]   the one launch's start-up, warm (after a flow) or cold
#                                                     (benchmarks/gpu_warm_start.py)
#   bash deploy/gpu/h200.sh export OUTDIR             the store's own export of every profile
# The store lives in /tmp/tt-home (kept while the machine stays up; copied out by `export`).
set -uo pipefail
G=/tmp/gv
export TABLETUNE_HOME=/tmp/tt-home TABLETUNE_FLEET=deploy/gpu/fleet.h200.yaml
# The card this machine has (a call may land on an H100): the fleet's gpu field says which, since a
# profile from one card is no evidence for the other.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o 'H[12]00' | head -1)
if [ -n "$CARD" ] && [ "$CARD" != H200 ]; then
  mkdir -p $TABLETUNE_HOME && sed "s/gpu: H200/gpu: $CARD/" deploy/gpu/fleet.h200.yaml > $TABLETUNE_HOME/fleet.$CARD.yaml
  export TABLETUNE_FLEET=$TABLETUNE_HOME/fleet.$CARD.yaml
  echo "[h200.sh] this machine has an $CARD: deployments run with gpu: $CARD" >&2
fi
export PYTHONPATH=$PWD:$G/duck:${PYTHONPATH:-}
DB=$TABLETUNE_HOME/h200.duckdb
mkdir -p "$TABLETUNE_HOME"
dep() { case "$1" in dense) echo h200-qwen3-4b-eagle3;; moe) echo h200-qwen3-30b-a3b-eagle3;; *) echo "engine $1?" >&2; exit 2;; esac; }
step=$1; shift
case "$step" in
  prep)
    # The duckdb wheel (cp312 manylinux, ~24 MiB) rides in its own transfer: carry .gpu/duck.
    for w in .gpu/duck/duckdb-*.whl; do [ -f "$w" ] && cp -u "$w" $G/; done
    W=$(ls $G/duckdb-*.whl 2>/dev/null | head -1)
    if [ ! -d $G/duck/duckdb ] && [ -n "$W" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target $G/duck "$W" && echo "[h200] duckdb ready"
    fi
    python3 -c "import duckdb, yaml, pydantic; print('[h200] imports ok: duckdb', duckdb.__version__)" 2>&1 | tail -1
    ;;
  plan)
    e=$1; shift
    python3 -m tabletune_pipelines.cli --deployment "$(dep $e)" profile --dry-run "$@"
    ;;
  profile)
    e=$1; shift
    python3 -m tabletune_pipelines.cli --deployment "$(dep $e)" --db $DB profile --startup-timeout 900 "$@"
    ;;
  table)
    python3 -m tabletune_pipelines.cli --deployment "$(dep $1)" --db $DB table --rates "$2" --format vllm
    ;;
  goodput)
    e=$1; shift
    python3 benchmarks/gpu_goodput.py --engine $e "$@"
    ;;
  controller)
    e=$1; shift
    python3 benchmarks/gpu_controller.py --engine $e "$@"
    ;;
  flow)
    e=$1; shift
    python3 benchmarks/gpu_flow.py --fleet $TABLETUNE_FLEET --deployment "$(dep $e)" --db $DB --out "${OUT:-/tmp/out}/$e" "$@"
    rc=$?
    cp $TABLETUNE_HOME/published/* $DB "${OUT:-/tmp/out}/$e/" 2>/dev/null
    exit $rc
    ;;
  start)
    e=$1; shift
    python3 benchmarks/gpu_warm_start.py --fleet $TABLETUNE_FLEET --deployment "$(dep $e)" --out "${OUT:-/tmp/out}/$e" "$@"
    ;;
  export)
    python3 -m tabletune_pipelines.store.export "$DB" "$1" && cp $DB "$1/" 2>/dev/null
    ;;
esac
