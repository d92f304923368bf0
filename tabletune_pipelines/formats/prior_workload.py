"""The workload an acceptance prior records (``formats.documents.AcceptancePrior.workload``): the bounds
of its numbers and the one check of its mapping. Stdlib only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tabletune_pipelines.errors import DocumentError
from tabletune_pipelines.options import Bound, check_value

WORKLOAD_BOUNDS: dict[str, Bound] = {
    "prompt_tokens": Bound(0.0, 10_000_000.0, low_open=True, why="mean tokens of a prompt"),
    "output_tokens": Bound(1.0, 10_000_000.0, why="mean tokens of an answer"),
}
"""The bounds of a prior's workload (``core.stepcost.Workload``): what it may say about requests."""


def check_workload(workload: Any, *, where: str) -> None:
    """A prior's ``workload`` mapping: ``prompt_tokens`` and ``output_tokens`` within ``WORKLOAD_BOUNDS``,
    ``source`` in words, no other key; else ``DocumentError`` naming ``where`` and the key."""
    if not isinstance(workload, Mapping):
        raise DocumentError(f"{where} must be a mapping of prompt_tokens, output_tokens and source")
    unknown = sorted(map(str, set(workload) - {*WORKLOAD_BOUNDS, "source"}))
    if unknown:
        raise DocumentError(f"{where}: unknown key(s) {unknown}; known: {[*WORKLOAD_BOUNDS, 'source']}")
    for name, bound in WORKLOAD_BOUNDS.items():
        if name not in workload:
            raise DocumentError(f"{where} lacks {name!r}")
        check_value(bound, name, workload[name], where=where, error=DocumentError)
    if not isinstance(workload.get("source", ""), str):
        raise DocumentError(f"{where}: source = {workload['source']!r:.60} must be a string")
