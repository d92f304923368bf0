"""The online controller: a vLLM plugin that loads the published table as its prior and keeps it
right while serving (docs/controller.md; the method: docs/method.md, "Online controller").

Turned on with ``--scheduler-cls tabletune_pipelines.controller.scheduler.ControllerScheduler`` and
the env var ``TABLETUNE_PUBLISHED_TABLE`` naming the published file.

Modules, one job each; only ``scheduler`` imports vLLM, the rest is numpy + stdlib and can be
driven without an engine (tests, a simulator). Its settings (``ControllerSettings``: every
parameter, its default, strict parsing) are a format of the published file and the fleet file:
``formats.controller_settings``.

    loader     published file -> StartPoint (or the reason to fall back); the engine-identity check
    search     vLLM-layout lookups (the table's dense/range forms are core.table's; the search
               itself is core.evidence, the offline tuner's); TableInForce: the table in force,
               its lookup and boundary hysteresis
    step_correction  live step-time correction of the profiled T(B, k), with its error
    step       StepOutcome (one engine step, as the hooks see it) and count_drafts (the one
               per-request count of drafted and kept tokens); stdlib only
    flapping   FlapCounter: switches of k per batch size, reversals, the flap backoff's holds
    observations  CostObserver: which step intervals observe T(B, k), clean and served
    evidence   Evidence: what a version keeps (draft histograms, estimator, step-time model,
               served workload) and the table search over it
    exploration  Exploration: runs at the largest k and the other k, the open decision's focus
    window     ExportWindow: the counts of one live-counters window and writing its line
    version    Installed: a published version built whole before it is put in force (prepare);
               FileWatch: when the published file is looked at again
    record     Counters and Notes: the controller's counters and its log lines
    logic      Controller: the coordinator of the parts above; the per-step hooks, rebuilds,
               reloads and export
    scheduler  the vLLM adapter: Scheduler / AsyncScheduler subclasses with the three hooks

The evaluation's adaptive baselines are not here: ``evaluation.baselines`` and its own adapter
``evaluation.scheduler`` (a production engine never imports them).

Importing this package imports nothing heavy; it may import only vLLM, numpy, the stdlib and the
stdlib/numpy-only library modules (``core``, ``formats.published``, ``formats.published_schema``,
``formats.live_counters``,
``formats.control_protocol``, ``formats.identity_match``, ``options``, ``vocab``, ``errors``);
``tests/architecture/test_import_isolation.py`` keeps it that way.
"""
