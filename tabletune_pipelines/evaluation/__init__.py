"""Evaluation library (docs/evaluation.md): a documented GPU step-time cost model, step-time surfaces from
the cost model or from stored profiles, and a closed-loop replay simulator that drives every
policy, the production controller included; and ``served``: the closed-loop load generator, window
measurement and step-log verification on a real server, and the served verification of a table
before it is published (docs/evaluation.md, "Served verification"). Numpy + stdlib only (no Dagster, no vLLM).
"""
