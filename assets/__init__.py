"""TableTune's software-defined assets and their checks (thin: they call the library and describe
what it produced). ``assets/definitions.py`` (the code location) discovers every asset in this folder.

Lineage: logged_prompts → acceptance_prior ─┐
         controller_live_counters → live_acceptance_counters ─┤
         step_time_profile ─────────────────────────────────┴→ draft_length_table → published_table
"""

OWNERS = ["team:tabletune"]
"""Owners of every asset (shown in the UI)."""
