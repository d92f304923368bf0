"""The prompt-file reader: one rule for every caller, messages that name the line and never the prompt."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.errors import PromptFileError, TableTuneError
from tabletune_pipelines.formats.prompts import count_prompts, load_prompts

SECRET = "the secret customer prompt"


def _write(tmp_path, text: str | bytes):
    p = tmp_path / "p.jsonl"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_reads_prompts_in_order_skipping_blank_lines_and_other_keys(tmp_path):
    p = _write(tmp_path, '{"prompt": "a", "id": 1}\n\n  \n{"prompt": "b", "ts": "2026-11-16T10:00:00Z"}\n')
    assert load_prompts(p) == ["a", "b"]
    assert count_prompts(p) == 2


@pytest.mark.parametrize("text, match", [
    ('{"prompt": "a"}\n{"prompt": "' + SECRET + '"\n', r"line 2: not valid JSON \(.* at column \d+\)"),
    ('{"prompt": "a"}\n\n["' + SECRET + '"]\n', r"line 3: expected a JSON object .*, got an array of 1 items"),
    ('"' + SECRET + '"\n', r"line 1: expected a JSON object .*, got a string of length 26"),
    ('{"text": "' + SECRET + '"}\n', r'line 1: the object has no "prompt" key \(1 other keys\)'),
    ('{"' + SECRET + '": 1}\n', r'line 1: the object has no "prompt" key'),
    ('{"prompt": ""}\n', r'line 1: "prompt" must be a non-empty string, got a string of length 0'),
    ('{"prompt": "   "}\n', r'line 1: "prompt" must be a non-empty string, got a string of only whitespace'),
    ('{"prompt": ["' + SECRET + '"]}\n', r'line 1: "prompt" must be a non-empty string, got an array of 1 items'),
    ('{"prompt": null}\n', r'line 1: "prompt" must be a non-empty string, got null'),
    ("", r"has no prompts \(it is empty or only blank lines\)"),
    ("\n \n", r"has no prompts"),
    (b'{"prompt": "caf\xe9"}\n', r"line 1: not UTF-8 text \(bad byte at column 16\)"),
])
@pytest.mark.parametrize("reader", [load_prompts, count_prompts])
def test_bad_files_raise_naming_file_and_line_never_the_text(tmp_path, text, match, reader):
    p = _write(tmp_path, text)
    with pytest.raises(PromptFileError, match=match) as err:
        reader(p)
    msg = str(err.value)
    assert msg.startswith(f"prompt file {p}")
    assert SECRET not in msg and "caf" not in msg
    assert isinstance(err.value, TableTuneError)


def test_a_bad_line_after_good_ones_is_not_skipped(tmp_path):
    lines = [json.dumps({"prompt": f"p{i}"}) for i in range(100)] + ["not json"]
    p = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(PromptFileError, match="line 101"):
        count_prompts(p)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(PromptFileError, match="is a directory"):
        count_prompts(tmp_path)
