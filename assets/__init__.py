"""Where people look for TableTune's assets: a thin re-export of the package's Dagster code.

The assets and their checks live in the package's ``defs/`` folder (``tabletune_pipelines/defs/``)
and the code location in ``tabletune_pipelines/definitions.py``, so a wheel install loads them from
any folder (``workspace.yaml``, ``dg``, ``tabletune run``). This folder holds no asset of its own:
``assets.definitions`` re-exports the package's, for a ``dagster dev -f assets/definitions.py`` or
an import from the checkout. The wheel does not install it.
"""
