"""The store's own export of step-time profiles: one JSON document per (identity, mode).

    python -m tabletune_pipelines.store.export STORE.duckdb OUTDIR

Each file is a ``StepTimeProfile`` document (``tabletune.step_time_profile``, with its engine
identity and every cell's repetitions, so spread and standard error can be recomputed), named
``<identity key>.<mode>.json``. This is how profiles measured where the pipeline does not run (a
GPU node) travel: as data, loadable with ``StepTimeProfile.from_json`` and importable into another
store with ``import_profiles``. A profile travels whole: its identity, its cells with their
repetitions and its mixed-step samples (what the served step cost is fitted on), so the imported
profile derives the table the source store derives. An imported profile replaces the store's
profile of its identity and mode whole (cells, samples and all), never merges into it. Every number
of an imported file is checked by the rules the writer's documents follow (``documents``:
``StepTimeCell``, ``SAMPLE_BOUNDS``; a mixed-step sample also within the identity's K and
max_num_seqs); a file that breaks one is named with the field, and nothing is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tabletune_pipelines.errors import DocumentError, TableTuneError, UnwritablePathError
from tabletune_pipelines.formats.documents import StepTimeProfile
from tabletune_pipelines.formats.strict_io import (
    FileTooLargeError,
    NotRegularFileError,
    atomic_write_text,
    read_bounded,
)
from tabletune_pipelines.store.duckdb_store import TableTuneStore

#: An exported profile is a few hundred kB (1024 batch sizes x 9 k x a few repetitions); larger is not one.
MAX_PROFILE_BYTES = 64 * 1024 * 1024


def _output_folder(out: Path) -> None:
    """Create ``out`` where missing; ``UnwritablePathError`` naming it when it is not a folder or
    cannot be created (nothing is written then)."""
    if out.exists() and not out.is_dir():
        raise UnwritablePathError(f"output folder {out} exists and is not a folder; nothing was written. Pass a "
                                  "folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnwritablePathError(f"cannot create the output folder {out} ({exc.strerror or exc}); nothing was "
                                  "written. Pass a folder you can write") from None


def export_profiles(store: TableTuneStore, out_dir: str | Path) -> list[Path]:
    """Write every stored profile as ``<key>.<mode>.json`` under ``out_dir``; returns the paths.

    Every profile is read (and checked) before the first file is written. Each file is replaced
    atomically (``strict_io.atomic_write_text``: a regular file there is replaced, a symbolic link, a
    folder or a named pipe is refused); ``UnwritablePathError`` when ``out_dir`` is not a folder or a
    file cannot be written."""
    out = Path(out_dir)
    profiles = [store.load_profile(key, mode) for key in store.identity_keys() for mode in store.profile_modes(key)]
    _output_folder(out)
    written: list[Path] = []
    for profile in profiles:
        path = out / f"{profile.identity.key}.{profile.mode}.json"
        try:
            atomic_write_text(path, profile.to_json(indent=1) + "\n")
        except OSError as exc:
            raise UnwritablePathError(f"cannot write {path} ({exc.strerror or exc}); "
                                      f"{len(written)} profile(s) were written before it") from None
        written.append(path)
    return written


def read_profile(path: str | Path) -> StepTimeProfile:
    """An exported profile document (a regular file of at most ``MAX_PROFILE_BYTES``, UTF-8 JSON);
    errors name the file."""
    try:
        raw, _ = read_bounded(path, MAX_PROFILE_BYTES)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise DocumentError(f"profile file {path} does not exist") from None
    except (IsADirectoryError, NotRegularFileError, FileTooLargeError) as exc:
        raise DocumentError(f"profile file {path}: {exc.strerror}; not an exported profile") from None
    except OSError as exc:
        raise DocumentError(f"cannot read profile file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DocumentError(f"profile file {path} is not UTF-8 (byte {exc.start})") from None
    try:
        return StepTimeProfile.from_json(text)
    except TableTuneError as exc:
        raise type(exc)(f"profile file {path}: {exc}") from None


def import_profiles(store: TableTuneStore, paths: list[str | Path]) -> int:
    """Write exported profile documents whole (identity, cells, mixed-step samples) into ``store``;
    returns the number of cells. Every file is read and checked first, then all go in one
    transaction: a bad file imports nothing. Each profile replaces the store's profile of its
    identity and mode whole (``TableTuneStore.write_profiles``): cells and samples the file does not
    hold are gone afterwards, so the derived table is the file's."""
    profiles = [read_profile(p) for p in paths]
    return store.write_profiles(profiles, sources=[f"profile file {p}" for p in paths])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tabletune_pipelines.store.export STORE.duckdb OUTDIR", file=sys.stderr)
        return 2
    try:
        if not Path(args[0]).exists():
            print(f"error: store {args[0]} does not exist", file=sys.stderr)
            return 2
        for p in export_profiles(TableTuneStore(args[0], read_only=True), args[1]):  # the store is only read
            print(p)
    except TableTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
