"""Tuning, as a library (no Dagster, no DuckDB): a profile and a prior become a table.

``derive`` (the table search's inputs and result), ``gates`` (whether a profile, prior or table
may be used; plain verdicts), ``feedback`` (the controller's live counters → a live prior) and
``report`` (markdown and the goodput plot).
"""
