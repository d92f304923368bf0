"""The fingerprint key file, read with a bound.

Before: the key (64 hex digits and a newline) was read whole, so a 1 GB file at that path took
2 GB of memory before it was refused. Now it is read with ``strict_io.read_bounded`` (256 bytes
at most), and anything larger is refused from its size without being read; the file is left as
it was."""

from __future__ import annotations

import importlib
import os
import tracemalloc

import pytest

from tabletune_pipelines.engine.acceptance import FINGERPRINT_KEY_FILE, fingerprint_key, prompt_fingerprint
from tabletune_pipelines.errors import InvalidValueError

pytestmark = pytest.mark.timeout(60)


def test_a_1_gb_key_file_is_refused_without_being_read(home):
    key_file = home / FINGERPRINT_KEY_FILE
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 1024 ** 3)  # sparse: costs no disk, and would cost 1 GB read whole
        os.pwrite(fd, b"0" * 64 + b"\n", 0)
    finally:
        os.close(fd)
    # the call below imports it; its memory is not the file's
    importlib.import_module("tabletune_pipelines.formats.fleet")

    tracemalloc.start()
    try:
        with pytest.raises(InvalidValueError) as err:
            prompt_fingerprint(["a prompt"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(f"fingerprint key {key_file} is {1024 ** 3} bytes; a key is 64 hex digits")
    assert peak < 1024 * 1024
    assert key_file.stat().st_size == 1024 ** 3 and (key_file.stat().st_mode & 0o777) == 0o600


def test_a_key_with_a_few_extra_bytes_is_still_read_and_one_past_the_bound_is_not(home):
    key = fingerprint_key(home)
    key_file = home / FINGERPRINT_KEY_FILE
    text = key_file.read_text()
    key_file.write_text(text.strip() + "\n" + " " * (256 - len(text.strip()) - 1))  # exactly 256 bytes
    assert key_file.stat().st_size == 256 and fingerprint_key(home) == key
    key_file.write_text(text.strip() + "\n" + " " * (256 - len(text.strip())))  # 257 bytes
    with pytest.raises(InvalidValueError, match="is 257 bytes; a key is 64 hex digits"):
        fingerprint_key(home)
