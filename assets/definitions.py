"""The package's code location (``tabletune_pipelines.definitions``), re-exported from the checkout
(``assets/__init__.py`` says why this folder stays)."""

from tabletune_pipelines.definitions import ASSET_CHECKS, ASSETS, defs, jobs

__all__ = ["ASSETS", "ASSET_CHECKS", "defs", "jobs"]
