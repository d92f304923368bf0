"""Evaluation library (issue 10): a documented GPU step-time cost model, step-time surfaces from
the cost model or from stored profiles, and a closed-loop replay simulator that drives every
policy, the production controller included. Numpy + stdlib only (no Dagster, no vLLM).
"""
