"""Start-up of an engine's one launch (the tuning flow's: ``tuning.deployments.one_launch``), cold or warm.

    python benchmarks/gpu_warm_start.py --deployment h200-qwen3-4b-eagle3 --out $OUT   # on the GPU machine

The compile caches of a GPU launch live under ``$TABLETUNE_HOME/compile-cache/<identity key>``
(``deployments.compile_cache_env``). Run after a flow on the same machine, this measures the warm
start the next flow of that engine gets; with ``--cold`` the engine's cache folder is moved aside
first. Prints and writes ``$OUT/start-<deployment>.json``: the seconds to a healthy server.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.tuning.deployments import compile_cache_dir, current_identity, one_launch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", default=None)
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--cold", action="store_true", help="move the engine's compile cache aside first")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log = logging.getLogger("gpu_warm_start")
    dep = load_fleet(args.fleet).deployment(args.deployment)
    identity = current_identity(dep)
    cache = compile_cache_dir(identity)
    had_cache = cache.is_dir() and any(cache.iterdir())
    if args.cold and had_cache:
        shutil.move(str(cache), str(cache) + f".aside-{int(time.time())}")
    t = time.monotonic()
    with one_launch(identity, dep, log=log) as server:
        startup = server.startup_seconds
    result = {"deployment": dep.name, "identity": identity.key, "cache": str(cache),
              "start": "cold" if (args.cold or not had_cache) else "warm", "startup_s": round(startup or 0.0, 1),
              "launch_and_stop_s": round(time.monotonic() - t, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"start-{dep.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
