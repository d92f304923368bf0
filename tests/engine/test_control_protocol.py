"""The control-file protocol: writer and reader of one channel, in one process (stdlib only)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tabletune_pipelines.errors import ControlProtocolError, ControlRejected, ControlTimeout, TableTuneError
from tabletune_pipelines.formats.control_protocol import (
    ControlReader,
    ControlWriter,
    ack_path,
    signature,
    write_distinct,
)


def test_command_round_trip(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    assert r.poll() is None  # no file yet
    seq = w.send({"k": 2})
    cmd = r.poll()
    assert cmd is not None and cmd.seq == seq == 1 and cmd.body == {"k": 2}
    assert r.poll() is None  # nothing new: one stat, no read
    r.ack(cmd.seq, table=[[1, 8, 2]])
    assert w.wait_ack(seq, timeout=1.0) == {"ack": 1, "table": [[1, 8, 2]]}


def test_every_write_changes_the_signature(tmp_path):
    # Same size, written back to back: the reader must still see each one.
    path = tmp_path / "ctl.json"
    sig = None
    seen = []
    for i in range(20):
        sig2 = write_distinct(path, json.dumps({"seq": i % 10}), sig)
        assert sig2 != sig and sig2 == signature(path)
        seen.append(sig2)
        sig = sig2
    w, r = ControlWriter(tmp_path / "b.json"), ControlReader(str(tmp_path / "b.json"))
    got = []
    for k in (1, 2, 3, 1, 2, 3):
        w.send({"k": k})
        got.append(r.poll().body["k"])
    assert got == [1, 2, 3, 1, 2, 3]


def test_reader_refusal_raises_in_the_writer(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    seq = w.send({"table": "nonsense"})
    r.reject(r.poll().seq, "table must be a list")
    with pytest.raises(ControlRejected, match="table must be a list"):
        w.wait_ack(seq, timeout=1.0)
    assert issubclass(ControlRejected, TableTuneError)


def test_unreadable_file_is_acknowledged_with_an_error(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    w.send({"k": 1})
    path.write_text("{not json")
    assert r.poll() is None
    ack = json.loads(ack_path(path).read_text())
    assert ack["ack"] is None and "unreadable command" in ack["error"]
    path.write_text(json.dumps({"k": 1}))  # no seq
    assert r.poll() is None and "integer 'seq'" in json.loads(ack_path(path).read_text())["error"]


def test_a_stale_error_does_not_answer_the_next_command(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    ack_path(path).write_text(json.dumps({"ack": None, "error": "old"}))
    seq = w.send({"k": 1})  # removes the old acknowledgement
    assert w.read_ack() is None
    r.ack(r.poll().seq)
    assert w.wait_ack(seq, timeout=1.0)["ack"] == seq


def test_wait_ack_pokes_until_the_reader_answers(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    pokes = []
    pending = []

    def poke():  # an idle engine takes a step when poked; here the poke is the step
        pokes.append(1)
        pending.extend(c for c in [r.poll()] if c is not None)
        if pending and len(pokes) >= 3:  # the command takes effect a few steps later
            r.ack(pending.pop().seq)

    assert w.request({"k": 3}, timeout=5.0, poke=poke, pause=0.0)["ack"] == 1
    assert len(pokes) >= 3


def test_timeout_names_the_command_and_file(tmp_path):
    w = ControlWriter(tmp_path / "ctl.json")
    t0 = time.monotonic()
    with pytest.raises(ControlTimeout, match=r"did not acknowledge k control within 0.2 s .*ctl.json"):
        w.request({"k": 1}, timeout=0.2, what="k control")
    assert time.monotonic() - t0 < 5


def test_a_new_writer_continues_the_sequence(tmp_path):
    path = tmp_path / "ctl.json"
    w = ControlWriter(path)
    w.send({"k": 1})
    w.send({"k": 2})
    w2 = ControlWriter(path)  # e.g. the controller restarted
    assert w2.last_seq == 2 and w2.send({"k": 3}) == 3


def test_seq_is_the_writers(tmp_path):
    with pytest.raises(ControlProtocolError, match="sets 'seq'"):
        ControlWriter(tmp_path / "c.json").send({"seq": 5})


def test_unconfigured_reader_is_inert(monkeypatch):
    monkeypatch.delenv("TABLETUNE_TEST_CHANNEL", raising=False)
    r = ControlReader.from_env("TABLETUNE_TEST_CHANNEL")
    assert r.path is None and r.poll() is None
    r.ack(1)  # nowhere to write: no error


def test_concurrent_reader_sees_the_last_command(tmp_path):
    path = tmp_path / "ctl.json"
    w, r = ControlWriter(path), ControlReader(str(path))
    stop = threading.Event()
    seen: list[int] = []

    def engine():
        while not stop.is_set():
            cmd = r.poll()
            if cmd is not None:
                seen.append(cmd.seq)
                r.ack(cmd.seq)
            time.sleep(0.001)

    t = threading.Thread(target=engine)
    t.start()
    try:
        for k in range(1, 31):
            w.request({"k": k % 4}, timeout=5.0)
    finally:
        stop.set()
        t.join()
    assert seen == list(range(1, 31))  # each acknowledged command was read exactly once
