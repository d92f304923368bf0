"""THE prompt-file reader: logged prompts as JSONL, one ``{"prompt": "..."}`` per line.

Format (UTF-8): each non-blank line is a JSON object with a non-empty string ``"prompt"``; other
keys (``id``, ``ts``, ...) are ignored; blank lines are skipped::

    {"prompt": "Summarise the following text: ..."}
    {"prompt": "def fib(n):", "id": 17}

A line may carry the prompt's length in tokens as ``"prompt_tokens"`` (an integer 1..2^24, as the
serving engine's tokenizer counted it): the acceptance measurement then puts the prompt in its
context bucket without tokenizing it; a line without it is tokenized by the measuring engine. A
length that is not such an integer is refused like any malformed line.

One rule for every caller (the acceptance measurement and the pipeline's prompt count): a
missing, unreadable or empty file and any malformed line raise ``PromptFileError`` naming the file
and the line number. Prompts are user data, so a message describes a bad line's shape (its JSON
type, its length) and never quotes it. A line longer than ``MAX_LINE_BYTES`` is refused without
being held in memory whole; a key twice in one object (a second ``"prompt"`` would replace the
first), NaN or Infinity, nesting past 64 levels, an integer of more than 32 digits (``strict_io``),
or a prompt with an unpaired UTF-16 surrogate escape (``"\ud800"``: not text vLLM can encode), is
refused too, and so is a path that is not a regular file (a named pipe). Stdlib only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tabletune_pipelines.errors import PromptFileError
from tabletune_pipelines.formats import strict_io
from tabletune_pipelines.formats.strict_io import LineTooLongError, NotRegularFileError, bounded_lines, open_regular

EXPECTED = '{"prompt": "..."}'
#: The largest logged ``prompt_tokens`` (a context length vLLM can hold: ``max_model_len``'s bound).
MAX_PROMPT_TOKENS = 2 ** 24
#: A prompt line is at most this long (a 1M-token prompt is ~4 MB of UTF-8).
MAX_LINE_BYTES = 16 * 1024 * 1024


def _shape(value: object) -> str:
    """A value's JSON type and size, never its content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"a string of length {len(value)}"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return type(value).__name__


def _prompt_of(path: Path, no: int, raw: bytes) -> str | None:
    """The prompt of line ``no`` (None for a blank line); a malformed line raises."""
    obj = _record_of(path, no, raw)
    return None if obj is None else obj["prompt"]


def _record_of(path: Path, no: int, raw: bytes) -> dict | None:
    """The JSON object of line ``no`` (None for a blank line), checked like ``_prompt_of``."""
    where = f"prompt file {path}, line {no}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{where}: not UTF-8 text (bad byte at column {exc.start + 1}); "
                              "re-encode the file as UTF-8") from None
    if not line.strip():
        return None
    line = line.rstrip("\r\n")  # so a JSON error's column is on this line
    try:
        obj = strict_io.loads(line)
    except strict_io.DuplicateKeyError as exc:  # a second "prompt" would silently replace the first
        which = "the key \"prompt\"" if exc.key == "prompt" else f"a key (of length {len(exc.key)})"
        raise PromptFileError(f"{where}: the object has {which} more than once; "
                              f"each line must be {EXPECTED}") from None
    except strict_io.StrictJSONError as exc:  # NaN, deep nesting, a huge integer: never quotes the line
        raise PromptFileError(f"{where}: not strict JSON ({exc}); each line must be {EXPECTED}") from None
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                              f"each line must be {EXPECTED}") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object like {EXPECTED}, got {_shape(obj)}")
    if "prompt" not in obj:
        raise PromptFileError(f"{where}: the object has no \"prompt\" key ({len(obj)} other keys); "
                              f"each line must be {EXPECTED}")
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        got = "a string of only whitespace" if isinstance(prompt, str) and prompt else _shape(prompt)
        raise PromptFileError(f"{where}: \"prompt\" must be a non-empty string, got {got}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptFileError(f"{where}: \"prompt\" (a string of length {len(prompt)}) has an unpaired UTF-16 "
                              f"surrogate escape at character {exc.start + 1}; it is not text") from None
    tokens = obj.get("prompt_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not 1 <= tokens <= MAX_PROMPT_TOKENS):
        got = f"the integer {tokens}" if isinstance(tokens, int) and not isinstance(tokens, bool) else _shape(tokens)
        raise PromptFileError(f"{where}: \"prompt_tokens\" must be an integer 1..{MAX_PROMPT_TOKENS} (the prompt's "
                              f"length in tokens), got {got}")
    if "prompt_tokens" in obj and tokens is None:
        raise PromptFileError(f"{where}: \"prompt_tokens\" must be an integer 1..{MAX_PROMPT_TOKENS} (the prompt's "
                              "length in tokens), got null; leave the key out when the length is unknown")
    return obj


def _lines(fh: BinaryIO, path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)``, each line read with a bound (``strict_io.bounded_lines``: a longer
    one is refused, never held whole)."""
    try:
        for no, raw, _ in bounded_lines(fh, MAX_LINE_BYTES):
            yield no, raw
    except LineTooLongError as exc:
        raise PromptFileError(f"prompt file {path}, line {exc.line_no}: longer than {MAX_LINE_BYTES} bytes "
                              f"({exc.size} bytes); each line must be one {EXPECTED}") from None


def iter_prompts(path: str | os.PathLike[str]) -> Iterator[str]:
    """The prompts of a file in order; raises ``PromptFileError`` at the first bad line or if none."""
    for obj in iter_records(path):
        yield obj["prompt"]


def iter_records(path: str | os.PathLike[str]) -> Iterator[dict]:
    """The JSON object of every prompt line in order (its ``"prompt"`` checked as above; other keys,
    such as the optional ``"mix"`` of TableTune's sample weeks, as they are)."""
    p = Path(path)
    try:
        fh = open_regular(p)  # a named pipe or device is refused, never opened for a blocking read
    except FileNotFoundError:
        raise PromptFileError(f"prompt file {p} does not exist; write one {EXPECTED} per line") from None
    except IsADirectoryError:
        raise PromptFileError(f"prompt file {p} is a directory; pass a JSONL file") from None
    except NotRegularFileError as exc:
        raise PromptFileError(f"prompt file {p} is {exc.kind}, not a regular file; it was not read. Pass a "
                              "JSONL file") from None
    except OSError as exc:
        raise PromptFileError(f"cannot read prompt file {p}: {exc.strerror or exc}") from None
    n = 0
    with fh:
        for no, raw in _lines(fh, p):
            obj = _record_of(p, no, raw)
            if obj is not None:
                n += 1
                yield obj
    if n == 0:
        raise PromptFileError(f"prompt file {p} has no prompts (it is empty or only blank lines); "
                              f"write one {EXPECTED} per line")


def load_prompts(path: str | os.PathLike[str]) -> list[str]:
    """Every prompt of a JSONL prompt file (see the module docstring for the rules)."""
    return list(iter_prompts(path))


def load_prompt_lengths(path: str | os.PathLike[str]) -> list[tuple[str, int | None]]:
    """Every prompt of a file with its logged ``prompt_tokens`` (None where the line has none)."""
    return [(obj["prompt"], obj.get("prompt_tokens")) for obj in iter_records(path)]


def count_prompts(path: str | os.PathLike[str]) -> int:
    """Number of prompts in a file, under the same rules as ``load_prompts`` (raises, never skips)."""
    return sum(1 for _ in iter_prompts(path))
