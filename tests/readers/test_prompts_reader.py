"""The prompt reader under hostile input: every malformed line is one
PromptFileError naming the file and line and describing the line's shape (type, length), never
its content; bytes that are not UTF-8 name the column; a huge line is refused without being held
in memory. And the stored fingerprint is keyed, so a guessed prompt set cannot be confirmed."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import pytest

from tabletune_pipelines.engine.acceptance import FINGERPRINT_KEY_FILE, fingerprint_key, prompt_fingerprint
from tabletune_pipelines.errors import InvalidValueError, PromptFileError, TableTuneError
from tabletune_pipelines.formats.prompts import MAX_LINE_BYTES, count_prompts, load_prompts
from tests.readers.conftest import assert_one_error, snapshot

SECRET = "Patient 4711 diabetes mellitus"
GOOD = json.dumps({"prompt": "fine"})

# Each case holds SECRET somewhere a careless message would quote: in a bad value, a key, a
# broken JSON text, a nested list.
MALFORMED = [
    ('{"prompt": "' + SECRET + '"', r"not valid JSON \(Expecting ',' delimiter at column 44\)"),
    ('{"prompt": "' + SECRET + '", }', r"not valid JSON \(Expecting property name enclosed in double quotes"),
    ('"' + SECRET + '"', r"expected a JSON object .*, got a string of length 30"),
    ('["' + SECRET + '", 1]', r"got an array of 2 items"),
    ("42", r"got a number"),
    ("null", r"got null"),
    ('{"text": "' + SECRET + '", "id": 1}', r'the object has no "prompt" key \(2 other keys\)'),
    ('{"' + SECRET + '": "x"}', r'the object has no "prompt" key \(1 other keys\)'),
    ('{"prompt": {"' + SECRET + '": 1}}', r'"prompt" must be a non-empty string, got an object with 1 keys'),
    ('{"prompt": ["' + SECRET + '"]}', r'got an array of 1 items'),
    ('{"prompt": 3.5}', r"got a number"),
    ('{"prompt": false}', r"got a boolean"),
    ('{"prompt": "\\t \\n "}', r"got a string of only whitespace"),
    ('{"prompt": "' + SECRET + '", "prompt": "x"}', r'the object has the key "prompt" more than once'),
    ('{"prompt": "' + SECRET + ' \\ud800 end"}', r'\(a string of length 36\) has an unpaired UTF-16 surrogate escape '
                                                 r'at character 32'),
]


@pytest.mark.parametrize("text,shape", MALFORMED, ids=[f"case{i}" for i in range(len(MALFORMED))])
@pytest.mark.parametrize("reader", [load_prompts, count_prompts], ids=["load", "count"])
def test_a_malformed_line_is_described_by_its_shape_never_its_content(tmp_path, text, shape, reader):
    path = tmp_path / "p.jsonl"
    path.write_text(f"{GOOD}\n\n{GOOD}\n{text}\n{GOOD}\n")
    before = snapshot(tmp_path)
    with pytest.raises(PromptFileError, match=shape) as err:
        reader(path)
    msg = str(err.value)
    assert msg.startswith(f"prompt file {path}, line 4: ")
    for word in SECRET.split():
        assert word not in msg.split(": ", 1)[1], msg  # not even one word of it
    assert isinstance(err.value, TableTuneError) and snapshot(tmp_path) == before


@pytest.mark.parametrize("raw,column", [(b'{"prompt": "caf\xe9"}', 16), (b"\xff", 1),
                                        (b'{"prompt": "\xed\xa0\x80"}', 13)],  # an encoded surrogate
                         ids=["latin1", "ff", "cesu"])
def test_bytes_that_are_not_utf8_name_the_line_and_column(tmp_path, raw, column):
    path = tmp_path / "p.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + raw + b"\n")
    with pytest.raises(PromptFileError) as err:
        load_prompts(path)
    assert f"line 2: not UTF-8 text (bad byte at column {column})" in str(err.value)
    assert "caf" not in str(err.value)


def test_a_huge_line_is_refused_without_being_held_in_memory(tmp_path):
    path = tmp_path / "p.jsonl"
    with path.open("wb") as fh:
        fh.write(GOOD.encode() + b"\n")
        fh.write(b'{"prompt": "' + b"y" * (MAX_LINE_BYTES + 10) + b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(PromptFileError) as err:
            count_prompts(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"line 2: longer than {MAX_LINE_BYTES} bytes" in str(err.value)
    assert peak < 2 * MAX_LINE_BYTES + 1024 * 1024


def test_the_cli_never_prints_the_prompt(run_cli, home):
    path = home / "p.jsonl"
    for text, shape in (MALFORMED[0], MALFORMED[6], MALFORMED[13]):
        path.write_text(f"{GOOD}\n{text}\n")
        err = assert_one_error(run_cli("acceptance", "--prompts", path), f"prompt file {path}, line 2")
        assert SECRET not in err and "Patient" not in err


# -- the keyed fingerprint ---------------------------------------------------------------------------

PROMPTS = ["What is 2 + 2?", SECRET]


def _plain_sha256(prompts):
    h = hashlib.sha256()
    for s in prompts:
        b = s.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def test_the_fingerprint_is_keyed_per_installation(home, tmp_path):
    fp = prompt_fingerprint(PROMPTS)
    key_file = home / FINGERPRINT_KEY_FILE
    assert key_file.exists() and (key_file.stat().st_mode & 0o777) == 0o600
    assert prompt_fingerprint(PROMPTS) == fp == prompt_fingerprint(PROMPTS, fingerprint_key(home))  # stable
    assert len(fp) == 64 and fp != _plain_sha256(PROMPTS)  # a guess hashed without the key does not match
    other = fingerprint_key(tmp_path / "other-install")
    assert prompt_fingerprint(PROMPTS, other) != fp  # another installation: another fingerprint
    assert prompt_fingerprint(["What is 2 + 2?", SECRET + " "]) != fp


def test_a_fingerprint_key_others_can_read_or_that_is_broken_is_refused(home):
    fingerprint_key(home)
    key_file = home / FINGERPRINT_KEY_FILE
    os.chmod(key_file, 0o644)
    with pytest.raises(InvalidValueError, match=f"fingerprint key {key_file} can be read by other users"):
        prompt_fingerprint(PROMPTS)
    os.chmod(key_file, 0o600)
    key_file.write_text("not hex\n")
    with pytest.raises(InvalidValueError, match="is not 64 hex digits"):
        prompt_fingerprint(PROMPTS)
    key_file.unlink()
    key_file.mkdir()
    with pytest.raises(InvalidValueError, match="is not a regular file"):
        prompt_fingerprint(PROMPTS)
