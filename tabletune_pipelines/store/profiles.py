"""The store's step-time profiles (tables ``step_time_cells`` and ``step_samples``): measured cells,
each replacing an earlier measurement of the same cell, and the mixed-step samples of the served
step-cost fit; whole profiles are imported in one transaction."""

from __future__ import annotations

from datetime import timedelta

import duckdb

from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.errors import DocumentError, NotFoundError, StoredDataError, TableTuneError
from tabletune_pipelines.formats.documents import (
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
    check_sample,
    check_samples,
)
from tabletune_pipelines.formats.profile_levels import at_context, context_levels, level_step_times
from tabletune_pipelines.store.group import now
from tabletune_pipelines.store.identities import IdentityTables
from tabletune_pipelines.vocab import DEFAULT_PROFILE_MODE, DEFAULT_PROMPT_TOKENS, PROFILE_MODES, is_profile_mode


class ProfileTables(IdentityTables):
    """Step-time cells and mixed-step samples, each of an engine identity in a profile mode."""

    def write_profile_cell(self, identity: EngineIdentity, cell: StepTimeCell, mode: str = "one_launch") -> None:
        """Store one measured cell, replacing an earlier measurement of the same cell."""
        self.write_profile_cells(identity, [cell], mode)

    def write_profile_cells(self, identity: EngineIdentity, cells: list[StepTimeCell],
                            mode: str = "one_launch") -> None:
        with self._transaction() as conn:
            self._insert_identity(conn, identity)
            for cell in cells:
                self._insert_cell(conn, identity.key, mode, cell)

    @staticmethod
    def _insert_cell(conn: duckdb.DuckDBPyConnection, key: str, mode: str, cell: StepTimeCell) -> None:
        conn.execute(
            "DELETE FROM step_time_cells WHERE identity_key = ? AND mode = ? AND acceptance = ? "
            "AND k IS NOT DISTINCT FROM ? AND batch_size = ? AND context_tokens = ?",
            [key, mode, cell.acceptance, cell.k, cell.batch_size, cell.context_tokens],
        )
        conn.execute(
            "INSERT INTO step_time_cells (identity_key, mode, acceptance, k, batch_size, median_ms, spread, "
            "repetitions_ms, launch_k, timing, measured_at, stderr_ms, context_tokens) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [key, mode, cell.acceptance, cell.k, cell.batch_size, cell.median_ms, cell.spread,
             list(cell.repetitions_ms), cell.launch_k, cell.timing, now(), cell.stderr_ms, cell.context_tokens],
        )

    def profile_cells(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> list[StepTimeCell]:
        """The measured cells of one identity in one profile mode (empty if none)."""
        # A store opened read-only may predate the stderr_ms column: NULL there, and the cell
        # recomputes the standard error from its repetitions.
        stderr = "stderr_ms" if self._has_column("step_time_cells", "stderr_ms") else "NULL"
        context = ("context_tokens" if self._has_column("step_time_cells", "context_tokens")
                   else str(DEFAULT_PROMPT_TOKENS))  # likewise: an older store's cells are at the default level
        rows = self.query(
            f"SELECT k, batch_size, median_ms, repetitions_ms, acceptance, launch_k, timing, {stderr}, {context} "
            "FROM step_time_cells WHERE identity_key = ? AND mode = ? "
            "ORDER BY 9, acceptance, k NULLS FIRST, batch_size",
            [identity_key, mode],
        )
        cells = []
        for r in rows:
            try:
                cells.append(StepTimeCell(k=r[0], batch_size=r[1], median_ms=r[2], repetitions_ms=tuple(r[3]),
                                          acceptance=r[4], launch_k=r[5], timing=r[6], stderr_ms=r[7],
                                          context_tokens=DEFAULT_PROMPT_TOKENS if r[8] is None else r[8]))
            except TableTuneError as exc:  # a row no measurement writes (edited or damaged): never used
                raise StoredDataError(
                    f"{self.path}: the stored step-time cell k={r[0]}, B={r[1]} ({r[4]}, mode {mode!r}"
                    + (f", context {r[8]}" if r[8] != DEFAULT_PROMPT_TOKENS else "") + ") of identity "
                    f"{identity_key!r} cannot be a measurement: {exc} (`tabletune profile "
                    f"{'' if r[0] is None else f'--ks {r[0]} '}--batch-sizes {r[1]}` replaces the row; nothing was "
                    "derived from it)") from None
        return cells

    def profile_modes(self, identity_key: str) -> list[str]:
        """The profile modes with at least one cell of this identity."""
        return [r[0] for r in self.query("SELECT DISTINCT mode FROM step_time_cells WHERE identity_key = ? "
                                         "ORDER BY mode", [identity_key])]

    def write_step_samples(self, identity: EngineIdentity, samples: list[StepSample], mode: str = "one_launch") -> None:
        """Replace the stored mixed-step samples of one identity and mode with ``samples`` (checked by
        ``documents.check_samples`` first, the rule every reader applies: a bad sample writes nothing)."""
        samples = list(check_samples(samples, where=f"mixed-step samples of {identity.key}"))
        self.upsert_identity(identity)
        with self._transaction() as conn:
            self._replace_samples(conn, identity.key, mode, samples)

    @staticmethod
    def _replace_samples(conn: duckdb.DuckDBPyConnection, key: str, mode: str, samples: list[StepSample]) -> None:
        """Replace one identity's samples in ``mode``; each row's ``measured_at`` is a microsecond after the
        one before, so they are read back in the order given (the order the profiler logged them)."""
        conn.execute("DELETE FROM step_samples WHERE identity_key = ? AND mode = ?", [key, mode])
        written = now()
        for i, s in enumerate(samples):
            conn.execute(
                "INSERT INTO step_samples (identity_key, mode, batch_size, k, decode_tokens, prefill_tokens, ms, "
                "measured_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [key, mode, int(s.batch), int(s.k), int(s.decode_tokens), int(s.prefill_tokens), float(s.ms),
                 written + timedelta(microseconds=i)])

    def write_profiles(self, profiles: list[StepTimeProfile], sources: list[str] | None = None) -> int:
        """Store whole profiles (identity, cells and mixed-step samples) in one transaction: imported
        profiles are all there or none is. A profile replaces the identity's profile in its mode
        whole: every stored cell and sample of that (identity, mode) is deleted and the profile's
        own are written, so the table derived afterwards comes from one measurement, never a mix of
        two (docs/usage.md, "Moving profiles between stores"). Two profiles of one (identity, mode)
        in one call are refused (``DocumentError`` naming both by ``sources``, e.g. the files they were
        read from), and nothing is written. Returns the cells written."""
        names = sources if sources is not None else [f"profiles[{i}]" for i in range(len(profiles))]
        seen: dict[tuple[str, str], int] = {}
        for i, profile in enumerate(profiles):
            where = seen.setdefault((profile.identity.key, profile.mode), i)
            if where != i:
                raise DocumentError(f"{names[where]} and {names[i]} are both the profile of "
                                    f"{profile.identity.key!r} in mode {profile.mode!r}; an import replaces a "
                                    "profile whole, so import one of them; nothing was imported")
        with self._transaction() as conn:
            for profile in profiles:
                key, mode = profile.identity.key, profile.mode
                self._insert_identity(conn, profile.identity)
                conn.execute("DELETE FROM step_time_cells WHERE identity_key = ? AND mode = ?", [key, mode])
                for cell in profile.cells:
                    self._insert_cell(conn, key, mode, cell)
                self._replace_samples(conn, key, mode, list(profile.samples))
        return sum(len(p.cells) for p in profiles)

    def step_samples(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> list[StepSample]:
        """The stored mixed-step samples (empty if none, or an older store opened read-only)."""
        if not self.query("SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND "
                          "schema_name = 'main' AND table_name = 'step_samples'"):
            return []
        rows = self.query("SELECT batch_size, k, decode_tokens, prefill_tokens, ms FROM step_samples WHERE "
                          "identity_key = ? AND mode = ? ORDER BY measured_at, batch_size, k, prefill_tokens, "
                          "decode_tokens, ms", [identity_key, mode])
        out = []
        for b, k, d, p, ms in rows:
            try:
                out.append(check_sample(StepSample(batch=b, k=k, decode_tokens=d, prefill_tokens=p, ms=ms),
                                        where=f"mixed-step sample B={b}, k={k}, P={p}"))
            except TableTuneError as exc:
                raise StoredDataError(f"{self.path}: a stored mixed-step sample of {identity_key!r} cannot be a "
                                      f"measurement: {exc} (profile again to replace it)") from None
        return out

    def context_levels(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> list[int]:
        """The context levels with a stored cell of this identity and mode, ascending."""
        return sorted({c.context_tokens for c in self.profile_cells(identity_key, mode)})

    def step_time_surface(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> dict[int, StepTimes]:
        """The (B, ctx) step-time surface of one identity: context level → ``StepTimes`` of that level's
        all-rejected cells with their errors (``core.noise.NoisySurface.step_times`` over B = 1..the
        identity's max_num_seqs). One level: the surface of the profile as without levels.
        NotFoundError when the identity has no cells in ``mode``."""
        profile = self.load_profile(identity_key, mode)
        return {level: level_step_times(at_context(profile, level)) for level in context_levels(profile)}

    def load_profile(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> StepTimeProfile:
        """The step-time profile of one identity in one mode; NotFoundError when it has no cells there."""
        identity = self.identity(identity_key)
        cells = self.profile_cells(identity_key, mode)
        if not cells:
            modes = self.profile_modes(identity_key)
            raise NotFoundError(
                f"engine identity {identity_key!r} has no step-time cells in mode {mode!r} in {self.path}"
                + (f"; it has cells in mode(s) {modes}" if modes else "; profile it first"))
        if not is_profile_mode(mode):  # the check StepTimeProfile makes, here where it narrows the type
            raise DocumentError(f"step-time profile: mode = {mode!r} must be one of {PROFILE_MODES}")
        return StepTimeProfile(identity=identity, cells=tuple(cells), mode=mode,
                               samples=tuple(self.step_samples(identity_key, mode)))
