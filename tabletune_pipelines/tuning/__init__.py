"""Tuning, as a library (no Dagster, no DuckDB import): a profile and a prior become a table.

``derive`` (the table search's inputs and result), ``gates`` (whether a profile, prior or table
may be used; plain verdicts), ``feedback`` (the controller's live counters → a live prior, and the
week's ingest of a fleet's counter files), ``report`` (markdown and the goodput plot), and what the
pipeline's assets call: ``measure`` (profile an engine identity; a week's acceptance priors) and
``build`` (the table of one engine identity from the store, with its gates and plot). Those take the
store, the fleet and the engine as arguments and return plain results. ``deployments`` is that
engine: a fleet deployment → its engine identity, profile, acceptance measurement and served
verification (``Engine``, what the pipeline's ``EngineResource`` and the CLI call); ``publishing``
publishes a table to the deployments running its engine (and rolls back); ``run_report`` is what
``tabletune run`` prints after publishing. The served check a table passes before it is published
is five modules: ``served_load`` (the closed-loop load), ``served_windows`` (a measured window and
what windows add up to), ``served_verdict`` (the verdict per load and the result), ``served_plan``
(options, the policies of each load, the budget plan, the sizing from the profile) and
``served_verification`` (the run loop, ``verify_on_server``).
"""
