"""``tabletune_pipelines.formats.strict_io``, the one home of the rules every reader follows: regular
files only, bounded sizes, strict JSON. Worked examples at each bound;
the readers' own modules (test_special_files, test_json_bounds, ...) test what each reader makes of
these errors."""

from __future__ import annotations

import json
import os
import socket
import tracemalloc

import pytest

from tabletune_pipelines.formats import strict_io
from tabletune_pipelines.formats.strict_io import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    DuplicateKeyError,
    FileTooLargeError,
    LineTooLongError,
    NotRegularFileError,
    StrictJSONError,
    bounded_lines,
    loads,
    open_regular,
    read_bounded,
)

pytestmark = pytest.mark.timeout(60)  # a reader that blocked on a FIFO would hang: fail instead


# -- strict JSON ---------------------------------------------------------------------------------

def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_up_to_the_bound_is_fine_one_more_level_is_refused():
    assert loads(nested(MAX_DEPTH)) is not None
    assert loads('{"a": ' * (MAX_DEPTH - 1) + "{}" + "}" * (MAX_DEPTH - 1)) is not None
    for text in (nested(MAX_DEPTH + 1), '{"a": ' * MAX_DEPTH + "{}" + "}" * MAX_DEPTH):
        with pytest.raises(StrictJSONError, match=f"nested more than {MAX_DEPTH} levels deep"):
            loads(text)


def test_nesting_past_pythons_recursion_limit_is_the_same_error_not_a_recursion_error():
    for depth in (1_000, 100_000, 1_000_000):
        with pytest.raises(StrictJSONError, match="nested more than 64 levels deep"):
            loads(nested(depth))
    with pytest.raises(StrictJSONError):
        loads('{"a": ' * 50_000 + "1" + "}" * 50_000)


def test_brackets_inside_strings_are_not_nesting():
    assert loads(json.dumps({"note": "[" * 500})) == {"note": "[" * 500}


def test_integers_up_to_32_digits_are_fine_longer_ones_are_refused():
    assert loads("9" * MAX_INT_DIGITS) == int("9" * MAX_INT_DIGITS)
    assert loads("-" + "9" * MAX_INT_DIGITS) == -int("9" * MAX_INT_DIGITS)
    for digits in (MAX_INT_DIGITS + 1, 400, 4_301, 100_000):  # 4301: past Python's own str->int limit
        with pytest.raises(StrictJSONError, match=f"an integer of {digits} digits; at most 32 digits are allowed"):
            loads(f'{{"n": {"7" * digits}}}')


def test_numbers_that_overflow_to_infinity_and_the_constants_are_refused():
    assert loads("1e308") == 1e308 and loads("1e-999") == 0.0  # underflow is a (tiny) finite number
    for text in ("1e309", "-1e999", "[1.5e400]"):
        with pytest.raises(StrictJSONError, match="finite number"):
            loads(text)
    for name in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(StrictJSONError, match=f"{name} is not a number JSON allows"):
            loads(f"[{name}]")
    assert loads("[NaN, 1e999]", allow_nan=True)[1] == float("inf")  # TableTune's own stored documents


def test_a_duplicate_key_is_refused_and_named():
    with pytest.raises(DuplicateKeyError, match="duplicate key 'seq'") as err:
        loads('{"seq": 1, "x": {"a": 1}, "seq": 2}')
    assert err.value.key == "seq"
    with pytest.raises(DuplicateKeyError):
        loads('[{"a": 1, "a": 1}]')  # same value: still written twice


def test_syntax_errors_stay_json_decode_errors_and_everything_is_a_value_error():
    with pytest.raises(json.JSONDecodeError):
        loads('{"a": 1')
    for text in ('{"a": 1', nested(10**5), "9" * 5000, "NaN", '{"a":1,"a":2}'):
        with pytest.raises(ValueError):
            loads(text)


# -- regular files, bounded ------------------------------------------------------------------------

def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError) as err:
        open_regular(fifo)
    assert err.value.kind == "a named pipe (FIFO)" and err.value.filename == str(fifo)
    assert "not a regular file" in err.value.strerror
    with pytest.raises(NotRegularFileError):
        read_bounded(fifo, 10)


def test_devices_sockets_and_folders_are_refused(tmp_path):
    if os.path.exists("/dev/zero"):
        with pytest.raises(NotRegularFileError, match="character device"):
            read_bounded("/dev/zero", 10)  # would never end
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(NotRegularFileError, match="a socket"):
            open_regular(sock_path)
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent")


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    (tmp_path / "a").write_bytes(b"{}")
    os.symlink(tmp_path / "a", tmp_path / "link")
    assert read_bounded(tmp_path / "link", 10)[0] == b"{}"


def test_read_bounded_refuses_a_large_file_without_reading_it(tmp_path):
    big = tmp_path / "big"
    with big.open("wb") as fh:  # 1 GB, sparse: nothing to read costs nothing but the refusal
        fh.truncate(1024 ** 3)
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLargeError) as err:
            read_bounded(big, 64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (err.value.size, err.value.limit) == (1024 ** 3, 64) and peak < 1024 * 1024
    (tmp_path / "ok").write_bytes(b"x" * 64)
    raw, st = read_bounded(tmp_path / "ok", 64)
    assert raw == b"x" * 64 and st.st_size == 64


def test_bounded_lines_measures_a_long_line_without_holding_it(tmp_path):
    p = tmp_path / "l"
    p.write_bytes(b"ab\n" + b"x" * 10 + b"\n" + b"y" * 100_000 + b"\nlast")
    with p.open("rb") as fh:
        lines = bounded_lines(fh, 10)
        assert next(lines) == (1, b"ab", True)
        assert next(lines) == (2, b"x" * 10, True)  # exactly the bound: fine
        with pytest.raises(LineTooLongError) as err:
            next(lines)
    assert (err.value.line_no, err.value.size, err.value.limit) == (3, 100_000, 10)
    with p.open("rb") as fh:
        assert list(bounded_lines(fh, 200_000))[-1] == (4, b"last", False)  # a torn last line: not ended


def test_the_module_is_stdlib_only():
    """The controller inside vLLM imports it (through published): only the stdlib."""
    import ast

    tree = ast.parse(open(strict_io.__file__).read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported <= {"__future__", "errno", "json", "math", "os", "stat", "collections", "typing", "pathlib",
                        "tempfile"}, imported
