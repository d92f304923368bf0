"""Options from a mapping: the one rule by which a typed options dataclass is read from a dict.

A fleet file, a Dagster run or resource config and a published file hand TableTune plain mappings;
the typed options classes (``engine.plan.ProfileOptions``, ``deployments.AcceptanceOptions``,
``tuning.served_plan.ServedVerificationOptions``, ``formats.controller_settings.ControllerSettings``) are read
from them by ``options_from_mapping`` alone: a mapping (or None for every default), no key the class
does not know (each unknown key named, with ``where`` and the known keys), and every error of the
class's own validation prefixed with ``where``. The error class is the caller's layer's
(``EngineConfigError``, ``InvalidValueError``, ``SettingsError``).

``field_docs`` reads the docstring under each field of a dataclass, so a schema built on another
layer (a Dagster resource's config) can show a field's meaning without writing it a second time.

``Bound`` is the one rule for a number read from outside: of the right kind (an integer, or a
finite number; never a bool, NaN or infinity) and within a lower and an upper bound that mean
something. A class declares its numeric fields' bounds once, in a ``BOUNDS`` class attribute
(``{field: Bound}``), and its ``__post_init__`` calls ``check_bounds``; a document's nested numbers
(the mixed-step samples of a profile, a prior's workload) are checked by the same ``Bound``s through
``check_value``. Every refusal is one line: ``<source>: <field> = <value> must be ... (<why>)``.

Stdlib only (and ``errors``): the controller imports it inside vLLM serving processes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.vocab import MAX_STEP_MS

__all__ = ["BATCH_SIZE", "CONTEXT_TOKENS", "COUNT", "DRAFT_LENGTH", "LAUNCH_K", "STEP_MS", "TOKENS", "Bound",
           "check_bounds", "check_value", "context_levels_problem", "field_docs", "options_from_mapping"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def options_from_mapping(cls: type[T], data: Mapping[str, Any] | None, *, where: str, error: type[Exception],
                         noun: str = "key", exact_numbers: bool = False) -> T:
    """``cls(**data)`` for the dataclass ``cls``; None = every default.

    Not a mapping, or a key that is not a field of ``cls``, raises ``error`` naming ``where``, the
    unknown key(s) and the known ones (``noun``: what a key is called, e.g. ``setting``). A field
    typed ``bool`` takes only true or false (``"no"`` is refused, not read as on). A
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
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    unknown = sorted(str(k) for k in data if k not in names)
    if unknown:
        raise error(f"{where}: unknown {noun}(s) {unknown}; known {noun}s: {names}")
    body = dict(data)
    for f in fields:  # a bool is true or false: "no", 0 or "false" would count as on or be kept as text
        if f.type in ("bool", bool) and f.name in body and type(body[f.name]) is not bool:
            raise error(f"{where}: {f.name} = {shown(body[f.name])} must be true or false")
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
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


# -- bounds of numbers ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of one number read from outside, and why it ends where it does."""

    low: float
    """Smallest value allowed (``low_open``: not ``low`` itself)."""
    high: float
    """Largest value allowed (``high_open``: not ``high`` itself)."""
    integer: bool = False
    """An integer (a JSON ``3.0`` is not one); else any finite number (an integer included)."""
    low_open: bool = False
    """True: ``low`` itself is not allowed."""
    high_open: bool = False
    """True: ``high`` itself is not allowed."""
    why: str = ""
    """What the value means and why the bounds are where they are (shown in the refusal)."""
    optional: bool = False
    """None is allowed (it means the default the field names)."""

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is allowed, else what it must be (the text after ``name = value``)."""
        if value is None and self.optional:
            return None
        if isinstance(value, bool):  # True is not 1 here: a bool is never a number
            ok = False
        elif self.integer:  # a JSON 3.0 is not an integer; numpy's integers are
            ok = isinstance(value, numbers.Integral)
        else:  # an integer too large for a float is compared exactly
            ok = isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and math.isfinite(value))
        if ok:
            ok = ((value > self.low if self.low_open else value >= self.low)
                  and (value < self.high if self.high_open else value <= self.high))
        if ok:
            return None
        kind = "an integer" if self.integer else "a finite number"
        text = f"must be {kind} {'>' if self.low_open else '>='} {_num(self.low)} and " \
               f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return text + (" or null" if self.optional else "") + (f" ({self.why})" if self.why else "")

    def doc(self) -> str:
        """The range as the docs write it: ``1..100000``, ``(0, 86400]``."""
        if self.integer:
            return f"{_num(self.low)}..{_num(self.high)}"
        return f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"



def _num(x: float) -> str:
    """A bound as written: ``100000``, ``0.5``, ``1e+12``."""
    return str(int(x)) if float(x).is_integer() and (abs(x) < 1e7 or isinstance(x, int) and abs(x) < 1e16) \
        else f"{x:g}"


def shown(value: Any) -> str:
    """``repr`` of a value for a one-line message, shortened (a YAML integer can have hundreds of digits)."""
    r = repr(value)
    r = r if len(r) <= 40 else f"{r[:24]}... ({len(r)} characters)"
    return r.replace("\n", " ")


def check_value(bound: Bound, name: str, value: Any, *, where: str, error: type[Exception]) -> Any:
    """``value`` when ``bound`` allows it, else ``error``: ``<where>: <name> = <value> must be ...``."""
    problem = bound.problem(value)
    if problem is not None:
        raise error(f"{where}: {name} = {shown(value)} {problem}")
    return value


def check_bounds(obj: Any, *, where: str, error: type[Exception]) -> None:
    """Every field of ``obj`` named in its class's ``BOUNDS`` checked by ``check_value``; a list or
    tuple value is checked element by element (``loads[1]``; None is allowed for the whole field
    only, by an ``optional`` bound)."""
    for name, bound in type(obj).BOUNDS.items():
        value = getattr(obj, name)
        if isinstance(value, (list, tuple)):
            each = dataclasses.replace(bound, optional=False)
            for i, v in enumerate(value):
                check_value(each, f"{name}[{i}]", v, where=where, error=error)
        else:
            check_value(bound, name, value, where=where, error=error)


# -- the bounds several classes share (each declared here once) ---------------------------------

MIN_STEP_MS = 1e-3
"""Shortest step time any cell, sample or published ``step_ms`` may hold (a microsecond: no engine
step is shorter, and goodput divides by the step time, so a time near zero would make one k win
everywhere)."""
STEP_MS = Bound(MIN_STEP_MS, MAX_STEP_MS, why="milliseconds of one engine step")
"""A step time in milliseconds (``vocab.MAX_STEP_MS`` says why the upper bound is where it is)."""
BATCH_SIZE = Bound(1, 4096, integer=True, why="requests in a step; 4096 is the largest max_num_seqs a fleet has")
"""A batch size, and ``max_num_seqs``."""
LAUNCH_K = Bound(1, 64, integer=True, why="num_speculative_tokens of a launch; vLLM's K is at most a few dozen")
"""A launch's K (``max_k``)."""
DRAFT_LENGTH = Bound(0, 64, integer=True, why="drafts per request; at most the launch's K")
"""A draft length k (0: no drafts)."""
TOKENS = Bound(0, 10_000_000, integer=True, why="tokens in one step or one request")
CONTEXT_TOKENS = Bound(1, 2 ** 24, integer=True, why="a context level: tokens of each timed request's prompt")


def context_levels_problem(levels: Sequence[Any], *, quoted: bool = False) -> str | None:
    """What is wrong with ``levels`` as context levels (non-empty, each within ``CONTEXT_TOKENS``,
    strictly ascending), naming the bad value (``quoted``: the field named as a file's key,
    ``'context_levels[1]'``); None when nothing is. The one check of the fleet field and of the profile
    plan's option, each raising its own error with this text."""
    def name(i: int | None = None) -> str:
        n = "context_levels" + ("" if i is None else f"[{i}]")
        return f"'{n}'" if quoted else n

    if not levels:
        return f"{name()} = [] is empty; give at least one level in tokens, or null for one level"
    for i, level in enumerate(levels):
        why = CONTEXT_TOKENS.problem(level)
        if why:
            return f"{name(i)} = {level!r:.40} {why}"
    if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
        return f"{name()} = {list(levels)!r} must be strictly ascending (each level once)"
    return None
"""A context level in tokens (a step-time cell's ``context_tokens``, a plan's ``context_levels``)."""
"""A count of tokens a step or a request carries."""
COUNT = Bound(0, 10 ** 15, integer=True, why="a count of drafts or steps")
"""Counts of drafts, steps and prompts (10^15: a year of a large fleet's drafts is ~10^14)."""
