"""TableTune: measured, self-correcting draft-length tables for vLLM Dynamic Speculative Decoding.

Importing this package (or ``tabletune_pipelines.core`` / ``tabletune_pipelines.controller``)
pulls in numpy and the stdlib only; Dagster, pandas and DuckDB are imported by the modules
that need them (``store``, ``orchestration``, ``assets``), never from here.
"""

__version__ = "0.1.0"
