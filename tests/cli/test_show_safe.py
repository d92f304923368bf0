"""Hostile input, fourth round, class 7: what ``show`` prints is safe and complete.

A hand-edited published file's strings reach the terminal with every control character written as an
escape (no escape sequence, C1 code or bidirectional override acts on the terminal), a number of
hundreds of digits is printed in short form, and ``show`` notes when the file's graph envelope
(capture ceiling, token budget) differs from the fleet's, since the controller refuses such a file."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tabletune_pipelines.cli import main, terminal_safe
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.tuning.derive import derive_table
from tests.cli.test_cli_evidence import IDENT, noisy_store
from tests.cli.test_cli_show import _section, publish

ACTIVE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def edited(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def hostile(doc):
    sv = doc["served_verification"]
    sv["device"] = "\x1b[2J\x1b[31mRED"
    sv["acceptance"] = "real\x9b6n"
    doc["prior"]["source"] = "measured\x1b]0;owned\x07\u202egnp.exe"
    sv["per_load"][0]["ratio"] = 1e300
    sv["per_load"][0]["ratio_se"] = 1e299


def test_show_writes_control_characters_as_escapes_and_long_numbers_short(home, capsys):
    dep, table, _ = publish(served=lambda ranges: _section(ranges, ["pass", "pass"]))
    edited(dep.published_table, hostile)
    capsys.readouterr()
    assert main(["show"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert not any(ACTIVE.search(line) for line in lines), [line for line in lines if ACTIVE.search(line)]
    assert not re.search(r"\d{25,}", out)
    assert "(measured\\x1b]0;owned\\x07\\u202egnp.exe)" in out
    assert "on \\x1b[2J\\x1b[31mRED, acceptance real\\u009b6n" in out
    assert "table / best fixed k (k=1) = 1e+300 ± 1e+299" in out
    # --json stays the document, escaped by JSON itself.
    assert main(["show", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert not ACTIVE.search(out.replace("\n", "")) and json.loads(out)["served_verification"]["device"] == \
        "\x1b[2J\x1b[31mRED"


def test_terminal_safe_keeps_plain_text():
    line = "  table       B 1-16: k=3 · 17-64: k=2   (K = 3, max_num_seqs = 64) ± 0.012 — é"
    assert terminal_safe(line) == line
    assert terminal_safe("a\tb\rc\nd") == "a\tb\\rc\\nd"  # a tab only moves the cursor on


FLEET = """schema_version: 1
deployments:
  - name: h200
    endpoint: http://127.0.0.1:9/
    gpu: H200
    model: /m/target
    drafter: null
    method: ngram
    max_k: 3
    max_num_seqs: 16
    logged_prompts: {home}/prompts
    published_table: {home}/published/h200.json
{extra}"""


@pytest.mark.parametrize("extra,differs", [
    ("", "capture ceiling (max_cudagraph_capture_size) 1024 != the deployment's 128"),
    ("    max_cudagraph_capture_size: 256\n",
     "capture ceiling (max_cudagraph_capture_size) 1024 != the deployment's 256"),
])
def test_show_notes_a_graph_envelope_other_than_the_fleets(home, tmp_path, capsys, extra, differs):
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(FLEET.format(home=home, extra=extra))
    dep = load_fleet(fleet_path).deployments[0]
    store = noisy_store(home / "s.duckdb")
    prior = store.latest_acceptance_prior()
    table = derive_table(store.load_profile(IDENT.key), prior).table
    ident = dataclasses.replace(identity_for(dep, "0.26.0"), capture_ceiling=1024)
    store.publish(dep.name, table, dep.published_table, document_fields=controller_fields(identity=ident, prior=prior))
    assert main(["--fleet", str(fleet_path), "--db", str(home / "s.duckdb"), "show"]) == 0
    out, _ = capsys.readouterr()
    note = [line for line in out.splitlines() if line.startswith("NOTE: ")]
    assert len(note) == 1 and differs in note[0] and "the deployment's controller refuses it" in note[0], note
    # The same file under the fleet's own envelope gets no note.
    same = dataclasses.replace(ident, capture_ceiling=identity_for(dep, "0.26.0").capture_ceiling)
    store.publish(dep.name, table, dep.published_table, document_fields=controller_fields(identity=same, prior=prior))
    assert main(["--fleet", str(fleet_path), "--db", str(home / "s.duckdb"), "show"]) == 0
    assert "NOTE: " not in capsys.readouterr().out
