"""Evaluation library (docs/evaluation.md): a documented GPU step-time cost model, step-time surfaces from
the cost model or from stored profiles, and a closed-loop replay simulator that drives every
policy, the production controller included; and ``served``: the measuring harness on a real server
(every policy at every load, losses against the best fixed k, the envelope comparison) over
``tuning.served_*``, the served verification a table passes before it is published
(docs/evaluation.md, "Served verification"). Numpy + stdlib only (no Dagster, no vLLM), except
``scheduler`` (the evaluation's vLLM plugins, loaded inside the engine). This package sits on top of
the import graph: nothing in ``tuning``, ``store``, ``controller`` or ``orchestration`` imports it.

For the benchmarks and the engine tests: ``rig`` (a live engine running the controller, its
closed-loop load, published versions and exported windows), ``synthetic`` (profiles, tables,
priors and published files with no measurement behind them), ``simulator.FakeEngine`` (the fast
stand-in engine of the controller's pure-logic tests) and ``bench`` (the benchmark scripts'
shared command-line helpers). The production controller imports none of this package, and the
package imports nothing from ``tests/``.
"""
