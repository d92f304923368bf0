"""The package's Dagster ``defs/`` folder: TableTune's software-defined assets and their checks (thin:
they call the library and describe what it produced). ``tabletune_pipelines.definitions`` (the code
location) loads every module of this folder the way ``dg.load_from_defs_folder`` loads a project's.

Lineage: logged_prompts → acceptance_prior ─┐
         controller_live_counters → live_acceptance_counters ─┤
         step_time_profile ─────────────────────────────────┴→ draft_length_table → published_table
"""

OWNERS = ["team:tabletune"]
"""Owners of every asset (shown in the UI)."""
