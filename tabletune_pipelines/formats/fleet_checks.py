"""The fleet file's value checks that need nothing but the value: names, vLLM option tokens, one-line
strings, JSON-able values, context levels, and ``problem``, the validation error whose message is final. The models
in ``formats.fleet`` call them from their validators; the paths' variable expansion stays there
with ``tabletune_home``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticCustomError

from tabletune_pipelines.options import context_levels_problem

__all__ = ["NAME_RE", "TOKEN_RE", "check_context_levels", "check_name", "check_token", "json_value", "one_line",
           "problem"]

#: Deployment and engine-group names: they become run tags, Kubernetes label values (63 characters
#: at most), partition keys and file names, so they start with a letter or digit.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: Values passed to vLLM as option values (dtype, cudagraph mode, load format): one plain token.
TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def problem(message: str) -> PydanticCustomError:
    """A validation error whose message is final (``_describe`` prefixes only file and deployment)."""
    return PydanticCustomError("tabletune", "{message}", {"message": message})


def check_name(value: str, key: str | None) -> str:
    """``value`` if it is a deployment or engine-group name (``NAME_RE``), else a ``problem`` naming ``key``."""
    # fullmatch: a trailing newline must not pass the way it does with ``re.match(...$)``.
    if not NAME_RE.fullmatch(value):
        raise problem(f"{key!r} = {value!r} may only use letters, digits, '.', '_' and '-', must start with a "
                       "letter or digit, and may be at most 63 characters long")
    return value


def check_token(value: str | None, key: str | None) -> str | None:
    """``value`` if it is None or one vLLM option-value token (``TOKEN_RE``), else a ``problem`` naming ``key``."""
    if value is not None and not TOKEN_RE.fullmatch(value):
        raise problem(f"{key!r} = {value!r} must be one word of letters, digits, '.', '_', '+' and '-' that starts "
                       "with a letter or digit (vLLM gets it as an option value)")
    return value


def one_line(value: str, key: str | None, limit: int = 4096) -> str:
    """``value`` if it is one non-empty line of at most ``limit`` characters, else a ``problem`` naming ``key``."""
    if not value.strip() or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise problem(f"{key!r} = {value!r:.80} must be a non-empty line of at most {limit} characters without "
                       "control characters")
    return value


def json_value(value: Any, where: str, depth: int = 0) -> None:
    """Values that go into JSON documents and vLLM's --speculative-config: finite numbers, plain JSON
    types, at most 8 levels deep (the mapping's keys are strings by the field's type)."""
    if depth > 8:
        raise problem(f"{where!r} is nested more than 8 levels deep")
    if isinstance(value, float) and not math.isfinite(value):
        raise problem(f"{where!r} = {value!r} must be a finite number (JSON has no NaN or Infinity)")
    if isinstance(value, dict):
        for k, v in value.items():
            json_value(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            json_value(v, f"{where}[{i}]", depth + 1)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise problem(f"{where!r} = {value!r:.80} is a {type(value).__name__}; use a string, number, true/false, "
                       "null, list or mapping")


def check_context_levels(value: Any) -> tuple[int, ...] | None:
    """A deployment's ``context_levels``: null, or a non-empty list of token counts (integers within
    ``options.CONTEXT_TOKENS``, no bool), strictly ascending; else a ``problem`` naming the bad value."""
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple) or not value:
        raise problem(f"'context_levels' = {value!r:.80} must be a non-empty list of token counts, ascending "
                      "(e.g. [32, 128, 512, 1024]), or null for one level")
    why = context_levels_problem(value, quoted=True)
    if why:
        raise problem(why)
    return tuple(int(x) for x in value)
