"""TableTune's software-defined assets (thin: they call core/, tuning, store/, and the engine adapter).

Lineage: logged_prompts → acceptance_prior ─┐
         controller_live_counters → live_acceptance_counters ─┤
         step_time_profile ─────────────────────────────────┴→ draft_length_table → published_table
"""

from assets.acceptance import acceptance_prior, logged_prompts
from assets.feedback import controller_live_counters, live_acceptance_counters
from assets.profiles import step_time_profile
from assets.publishing import published_table, rollback_published_table
from assets.tables import draft_length_table

ALL_ASSETS = [logged_prompts, controller_live_counters, step_time_profile, acceptance_prior,
              live_acceptance_counters, draft_length_table, published_table]

__all__ = ["ALL_ASSETS", "acceptance_prior", "controller_live_counters", "draft_length_table",
           "live_acceptance_counters", "logged_prompts", "published_table", "rollback_published_table",
           "step_time_profile"]
