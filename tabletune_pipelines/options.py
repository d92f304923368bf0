"""Options from a mapping: the one rule by which a typed options dataclass is read from a dict.

A fleet file, a Dagster run or resource config and a published file hand TableTune plain mappings;
the typed options classes (``engine.plan.ProfileOptions``, ``deployments.AcceptanceOptions``,
``evaluation.served.ServedVerificationOptions``, ``controller.settings.ControllerSettings``) are read
from them by ``options_from_mapping`` alone: a mapping (or None for every default), no key the class
does not know (each unknown key named, with ``where`` and the known keys), and every error of the
class's own validation prefixed with ``where``. The error class is the caller's layer's
(``EngineConfigError``, ``InvalidValueError``, ``SettingsError``).

``field_docs`` reads the docstring under each field of a dataclass, so a schema built on another
layer (a Dagster resource's config) can show a field's meaning without writing it a second time.

Stdlib only (and ``errors``): the controller imports it inside vLLM serving processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from tabletune_pipelines.errors import TableTuneError

__all__ = ["field_docs", "options_from_mapping"]

T = TypeVar("T")


def options_from_mapping(cls: type[T], data: Mapping[str, Any] | None, *, where: str, error: type[Exception],
                         noun: str = "key", exact_numbers: bool = False) -> T:
    """``cls(**data)`` for the dataclass ``cls``; None = every default.

    Not a mapping, or a key that is not a field of ``cls``, raises ``error`` naming ``where``, the
    unknown key(s) and the known ones (``noun``: what a key is called, e.g. ``setting``). A
    ``TableTuneError`` of the class's own validation is raised again, of its own class, with
    ``where: `` in front. ``exact_numbers``: JSON has one number type, so an integral float (3.0)
    becomes an ``int`` field's integer and an integer a ``float`` field's float, but only where the
    conversion is exact (1e300 stays a float and is refused by name, not turned into a 301-digit
    integer; an integer too large for a float stays an integer).
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise error(f"{where} must be a mapping of {noun} names to values, got {type(data).__name__}")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in fields]
    unknown = sorted(str(k) for k in data if k not in names)
    if unknown:
        raise error(f"{where}: unknown {noun}(s) {unknown}; known {noun}s: {names}")
    body = dict(data)
    if exact_numbers:
        for f in fields:
            v = body.get(f.name)
            if f.type in ("int", int) and type(v) is float and v.is_integer() and abs(v) <= 2.0 ** 53:
                body[f.name] = int(v)
            if f.type in ("float", float) and type(v) is int and abs(v) <= 2 ** 53:
                body[f.name] = float(v)
    try:
        return cls(**body)
    except TableTuneError as exc:
        if len(exc.args) != 1 or not isinstance(exc.args[0], str):
            raise
        raise type(exc)(f"{where}: {exc.args[0]}") from None


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of the dataclass ``cls`` (the string literal on the
    line after ``name: type = default``), read from its source, whitespace folded; a field without
    one is absent (so is every field when the source cannot be read)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs
