"""The online controller (a vLLM plugin) will live here.

It runs inside production vLLM processes, so this package may import only vLLM, numpy and the
stdlib: the method it needs is in ``tabletune_pipelines.core`` (acceptance estimator, table search),
the prior it starts from is read with ``tabletune_pipelines.published``, and the live counters it
exports follow ``tabletune_pipelines.live_counters``. ``tests/core/test_import_isolation.py`` keeps
it that way.
"""
