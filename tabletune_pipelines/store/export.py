"""The store's own export of step-time profiles: one JSON document per (identity, mode).

    python -m tabletune_pipelines.store.export STORE.duckdb OUTDIR

Each file is a ``StepTimeProfile`` document (``tabletune.step_time_profile``, with its engine
identity and every cell's repetitions, so spread and standard error can be recomputed), named
``<identity key>.<mode>.json``. This is how profiles measured where the pipeline does not run (a
GPU node) travel: as data, loadable with ``StepTimeProfile.from_json`` and importable into another
store with ``import_profiles``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tabletune_pipelines.documents import StepTimeProfile
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.store.duckdb_store import TableTuneStore


def export_profiles(store: TableTuneStore, out_dir: str | Path) -> list[Path]:
    """Write every stored profile as ``<key>.<mode>.json`` under ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key in store.identity_keys():
        for mode in store.profile_modes(key):
            path = out / f"{key}.{mode}.json"
            path.write_text(store.load_profile(key, mode).to_json(indent=1) + "\n", encoding="utf-8")
            written.append(path)
    return written


def import_profiles(store: TableTuneStore, paths: list[str | Path]) -> int:
    """Write the cells of exported profile documents into ``store``; returns the number of cells."""
    n = 0
    for p in paths:
        profile = StepTimeProfile.from_json(Path(p).read_text(encoding="utf-8"))
        store.upsert_identity(profile.identity)
        store.write_profile_cells(profile.identity, list(profile.cells), profile.mode)
        n += len(profile.cells)
    return n


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tabletune_pipelines.store.export STORE.duckdb OUTDIR", file=sys.stderr)
        return 2
    try:
        if not Path(args[0]).exists():
            print(f"error: store {args[0]} does not exist", file=sys.stderr)
            return 2
        for p in export_profiles(TableTuneStore(args[0]), args[1]):
            print(p)
    except TableTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
