"""The store's acceptance priors (table ``acceptance_priors``, and ``acceptance_prior_buckets`` for a
prior measured per context bucket): measured priors and those fed by the controller's live counters,
each of a deployment and week, and the choice of the priors that apply to an engine identity. A prior
without bucket rows (one context bucket, or stored before buckets were) serves its rates at every
context."""

from __future__ import annotations

from tabletune_pipelines.errors import NotFoundError
from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity
from tabletune_pipelines.store.group import TableGroup, listing, now


class PriorTables(TableGroup):
    """Acceptance priors, measured or live."""

    def write_acceptance_prior(self, prior: AcceptancePrior, identity_key: str | None = None) -> str:
        pid = prior.prior_id
        with self._transaction() as conn:
            conn.execute("DELETE FROM acceptance_priors WHERE prior_id = ?", [pid])
            conn.execute(
                "INSERT INTO acceptance_priors VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [pid, prior.deployment, prior.week, identity_key, prior.source, list(prior.rates), prior.num_drafts,
                 prior.prompt_fingerprint, prior.prompt_count, prior.temperature, prior.to_json(), now()],
            )
            conn.execute("DELETE FROM acceptance_prior_buckets WHERE prior_id = ?", [pid])
            for b in prior.context or ():
                conn.execute("INSERT INTO acceptance_prior_buckets (prior_id, context_level, ctx_lo, ctx_hi, "
                             "prompt_count, num_drafts, rates, pooled, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [pid, b.level, b.lo, b.hi, b.prompt_count, b.num_drafts, list(b.rates), b.pooled,
                              b.reason])
        return pid

    def context_rates(self, prior_id: str) -> dict[int, tuple[float, ...]]:
        """Context level → the rates its bucket serves (its own, or the prior's where pooled), from the
        bucket rows; empty for a prior of one bucket (it serves its rates at every context) or an older
        store opened read-only."""
        if not self.query("SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND "
                          "schema_name = 'main' AND table_name = 'acceptance_prior_buckets'"):
            return {}
        rows = self.query("SELECT b.context_level, CASE WHEN b.pooled THEN p.rates ELSE b.rates END "
                          "FROM acceptance_prior_buckets b JOIN acceptance_priors p USING (prior_id) "
                          "WHERE b.prior_id = ? ORDER BY b.context_level", [prior_id])
        return {int(level): tuple(float(r) for r in rates) for level, rates in rows}

    def acceptance_prior(self, prior_id: str) -> AcceptancePrior:
        """The prior with this id; NotFoundError lists the newest stored ids."""
        row = self.query("SELECT prior_json FROM acceptance_priors WHERE prior_id = ?", [prior_id])
        if not row:
            raise NotFoundError(f"acceptance prior {prior_id!r} is not in {self.path}"
                                + listing("acceptance priors", self.acceptance_prior_ids(), "measure one first"))
        return AcceptancePrior.from_json(row[0][0])

    def acceptance_prior_ids(self) -> list[str]:
        """Every stored prior id, newest measurement first."""
        return [r[0] for r in self.query("SELECT prior_id FROM acceptance_priors ORDER BY measured_at DESC, prior_id")]

    def latest_acceptance_prior(self, deployment: str | None = None) -> AcceptancePrior | None:
        """The newest prior (of ``deployment``, if given; of any source), or None."""
        row = self.query(
            "SELECT prior_json FROM acceptance_priors WHERE (? IS NULL OR deployment = ?) "
            "ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
            [deployment, deployment],
        )
        return AcceptancePrior.from_json(row[0][0]) if row else None

    def latest_measured_prior(self, deployment: str, up_to_week: str) -> AcceptancePrior | None:
        """The deployment's newest ``measured`` prior of ``up_to_week`` or earlier (or without a week), or None."""
        rows = self.query("SELECT prior_json FROM acceptance_priors WHERE deployment = ? AND source = 'measured' "
                          "AND (week IS NULL OR week <= ?) ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
                          [deployment, up_to_week])
        return AcceptancePrior.from_json(rows[0][0]) if rows else None

    def applicable_priors(self, identity: EngineIdentity) -> list[AcceptancePrior]:
        """Priors that apply to ``identity``: its own, and those of identities with the same model,
        drafter and method (acceptance does not depend on the GPU or the vLLM version). Newest week
        first; within a week a live (controller-fed) prior before a measured one."""
        rows = self.query(
            """SELECT p.prior_json FROM acceptance_priors p
               LEFT JOIN engine_identities e ON p.identity_key = e.identity_key
               WHERE p.identity_key = ? OR (e.model = ? AND e.drafter IS NOT DISTINCT FROM ? AND e.method = ?)
               ORDER BY p.week DESC NULLS LAST, CASE p.source WHEN 'live' THEN 0 ELSE 1 END, p.measured_at DESC""",
            [identity.key, identity.model, identity.drafter, identity.method],
        )
        return [AcceptancePrior.from_json(text) for (text,) in rows]
