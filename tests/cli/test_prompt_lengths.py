"""A logged prompt's length in tokens (``"prompt_tokens"``, formats/prompts.py): a bad one is refused
like any malformed line, with one clear line naming the file and line, and nothing is written (no
store, no fingerprint key: the file is read before an engine starts)."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.errors import PromptFileError
from tabletune_pipelines.formats.prompts import count_prompts, load_prompt_lengths

SECRET = "my secret prompt text"
BAD = [  # (the value of "prompt_tokens" as JSON text, what the error says it got)
    ('"12"', "got a string of length 2"),
    ("0", "got the integer 0"),
    ("-3", "got the integer -3"),
    ("16777217", "got the integer 16777217"),
    ("true", "got a boolean"),
    ("1.5", "got a number"),
    ("[12]", "got an array of 1 items"),
    ("null", "got null; leave the key out when the length is unknown"),
]


def _file(path, value: str):
    path.write_text(json.dumps({"prompt": "fine", "prompt_tokens": 3}) + "\n"
                    + '{"prompt": "' + SECRET + '", "prompt_tokens": ' + value + "}\n")
    return path


@pytest.mark.parametrize("value, got", BAD, ids=[v for v, _ in BAD])
def test_a_bad_length_is_refused_naming_the_line(tmp_path, value, got):
    f = _file(tmp_path / "p.jsonl", value)
    with pytest.raises(PromptFileError) as err:
        count_prompts(f)
    msg = str(err.value)
    assert msg == (f'prompt file {f}, line 2: "prompt_tokens" must be an integer 1..16777216 (the prompt\'s length '
                   f"in tokens), {got}")
    assert SECRET not in msg and "\n" not in msg


def test_logged_lengths_are_read_beside_their_prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "a", "prompt_tokens": 1}) + "\n" + json.dumps({"prompt": "b c"}) + "\n"
                 + json.dumps({"prompt": "d", "prompt_tokens": 16777216}) + "\n")
    assert load_prompt_lengths(f) == [("a", 1), ("b c", None), ("d", 16777216)]


@pytest.mark.parametrize("value", ['"12"', "0", "null"])
def test_the_cli_refuses_a_bad_length_in_one_line_and_writes_nothing(home, run_cli, value):
    from tabletune_pipelines.formats.fleet import default_store_path

    before = sorted(p.name for p in home.rglob("*"))
    f = _file(home / "bad-length.jsonl", value)
    proc = run_cli("acceptance", "--prompts", str(f))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith(f"error: prompt file {f}, line 2: \"prompt_tokens\" must be an integer"), line
    assert SECRET not in proc.stderr and SECRET not in proc.stdout
    assert not default_store_path().exists()
    assert sorted(p.name for p in home.rglob("*")) == sorted([*before, "bad-length.jsonl"])
