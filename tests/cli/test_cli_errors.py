"""Every subcommand on an empty TABLETUNE_HOME and with each bad argument docs/operations.md lists
(docs/operations.md, "Command-line errors"): one ``error: ...`` line on stderr, no traceback, exit status 2.
Each case runs the CLI as a subprocess, as a user would; none of them starts an engine."""

from __future__ import annotations

import json

import pytest
import yaml

SECRET = "my secret prompt text"

# (id, arguments, what the error must say). {home} is the empty TABLETUNE_HOME; files named here
# are written by _files() below.
EMPTY_HOME = [
    ("show-nothing-published", ["show"], "does not exist; publish one"),
    ("table-no-store", ["table"], "no TableTune store at"),
    ("table-vllm-no-store", ["table", "--format", "vllm"], "no TableTune store at"),
    ("no-subcommand", [], "required: command"),
    ("unknown-subcommand", ["tune"], "invalid choice: 'tune'"),
    ("unknown-option", ["show", "--colour"], "unrecognized arguments: --colour"),
    ("fleet-not-yaml", ["--fleet", "{home}/not-yaml.yaml", "show"], "is not valid YAML"),
]
GLOBAL = [
    (f"{cmd[0]}-{bad}", opts + cmd, want)
    for cmd in (["profile"], ["acceptance", "--prompts", "{home}/good.jsonl"], ["table"], ["show"], ["run"])
    for bad, opts, want in (
        ("missing-fleet", ["--fleet", "{home}/missing.yaml"], "fleet file {home}/missing.yaml does not exist"),
        ("invalid-fleet", ["--fleet", "{home}/bad-fleet.yaml"], "unknown key 'max_num_seq'"),
        ("unknown-deployment", ["--deployment", "nosuch"],
         "`tabletune run` runs every deployment" if cmd == ["run"] else "deployment 'nosuch' is not in the fleet file"),
    )
]
PROFILE = [
    ("profile-batch-sizes-not-ints", ["profile", "--batch-sizes", "1,x"], "not a comma-separated list of integers"),
    ("profile-batch-size-zero", ["profile", "--batch-sizes", "0,4"], "argument --batch-sizes: [0] must be >= 1"),
    ("profile-batch-size-too-large", ["profile", "--batch-sizes", "4,99"],
     "batch size 99 is outside 1..max_num_seqs = 16 (deployment 'local-cpu'"),
    ("profile-k-too-large", ["profile", "--ks", "0,9"], "k = 9 is outside 0..num_speculative_tokens = 3"),
    ("profile-accept-batch-size-too-large", ["profile", "--accept-batch-sizes", "1,17"],
     "accept batch size 17 is outside 1..max_num_seqs = 16 (deployment 'local-cpu': max_num_seqs 16, max_k 3)"),
    ("profile-k-negative", ["profile", "--ks=-1"], "argument --ks: [-1] must be >= 0"),
    ("profile-repetitions-zero", ["profile", "--repetitions", "0"],
     "argument --repetitions: 0 must be an integer >= 1 and <= 100"),
    ("profile-repetitions-huge", ["profile", "--repetitions", "1000000000000"],
     "argument --repetitions: 1000000000000 must be an integer >= 1 and <= 100"),
    ("profile-repetitions-not-an-integer", ["profile", "--repetitions", "3.5"], "'3.5' is not an integer"),
    ("profile-remeasure-budget-negative", ["profile", "--remeasure-budget", "-5"],
     "argument --remeasure-budget: -5 must be a finite number >= 0 and <= 86400"),
    ("profile-remeasure-budget-huge", ["profile", "--remeasure-budget", "1e300"],
     "argument --remeasure-budget: 1e300 must be a finite number >= 0 and <= 86400"),
    ("profile-remeasure-budget-infinite", ["profile", "--remeasure-budget", "inf"],
     "argument --remeasure-budget: inf must be a finite number"),
    ("profile-remeasure-budget-not-a-number", ["profile", "--remeasure-budget", "2m"], "'2m' is not a number of seconds"),
    ("profile-max-repetitions-zero", ["profile", "--max-repetitions", "0"],
     "argument --max-repetitions: 0 must be an integer >= 1 and <= 100"),
    ("profile-max-repetitions-huge", ["profile", "--max-repetitions", "101"],
     "argument --max-repetitions: 101 must be an integer >= 1 and <= 100"),
    ("profile-startup-timeout-huge", ["profile", "--startup-timeout", "1e9"],
     "argument --startup-timeout: 1e9 must be a finite number >= 1 and <= 3600"),
    ("profile-startup-timeout-nan", ["profile", "--startup-timeout", "nan"],
     "argument --startup-timeout: nan must be a finite number"),
    ("profile-unknown-mode", ["profile", "--mode", "nosuch"], "argument --mode: invalid choice: 'nosuch'"),
    ("profile-unreachable-endpoint", ["--fleet", "{home}/remote.yaml", "profile"], "http://127.0.0.1:9/version"),
]
ACCEPTANCE = [
    ("acceptance-no-prompts-option", ["acceptance"], "required: --prompts"),
    ("acceptance-missing-file", ["acceptance", "--prompts", "{home}/missing.jsonl"], "does not exist"),
    ("acceptance-empty-file", ["acceptance", "--prompts", "{home}/empty.jsonl"], "has no prompts"),
    ("acceptance-malformed-line", ["acceptance", "--prompts", "{home}/bad.jsonl"], "line 2: not valid JSON"),
    ("acceptance-prompt-not-a-string", ["acceptance", "--prompts", "{home}/number.jsonl"],
     "line 1: \"prompt\" must be a non-empty string, got a number"),
    ("acceptance-not-utf8", ["acceptance", "--prompts", "{home}/latin1.jsonl"], "line 1: not UTF-8 text"),
    ("acceptance-prompts-is-a-folder", ["acceptance", "--prompts", "{home}"], "is a directory"),
    ("acceptance-bad-week", ["acceptance", "--prompts", "{home}/good.jsonl", "--week", "23-11-2026"],
     "argument --week: '23-11-2026' is not a date YYYY-MM-DD"),
]
TABLE_EMPTY = [
    ("table-db-is-a-folder", ["--db", "{home}", "table"], "is a directory"),
    ("table-db-not-duckdb", ["--db", "{home}/garbage.duckdb", "table"], "is not a DuckDB database"),
    ("table-unknown-format", ["table", "--format", "csv"], "argument --format: invalid choice: 'csv'"),
]
RUN = [
    ("run-week-not-monday", ["run", "--week", "2026-11-24"], "2026-11-24 is a Tuesday"),
    ("run-week-not-a-date", ["run", "--week", "last"], "'last' is not a date YYYY-MM-DD"),
    ("run-mix-unknown", ["run", "--mix", "poetry"], "--mix 'poetry': prompt mix(es) ['poetry'] not known"),
]
# Once a profile and a prior exist.
SEEDED = [
    ("table-unknown-prior", ["table", "--prior", "NOSUCH"], "--prior 'NOSUCH': acceptance prior 'NOSUCH' is not in"),
    ("table-unknown-identity", ["table", "--identity", "NOSUCH"], "--identity 'NOSUCH': no engine identity"),
    ("table-mode-not-profiled", ["table", "--mode", "fixed_k"], "no step-time cells in mode 'fixed_k'"),
    ("table-plot-into-missing-folder", ["table", "--plot", "{home}/no/such/dir/g.png"], "--plot"),
    ("show-with-a-store-but-nothing-published", ["show"], "does not exist; publish one"),
]


def _files(home):
    from tabletune_pipelines.formats.fleet import DEFAULT_FLEET_PATH

    (home / "good.jsonl").write_text(json.dumps({"prompt": "hello"}) + "\n")
    (home / "empty.jsonl").write_text("\n\n")
    (home / "bad.jsonl").write_text(json.dumps({"prompt": "ok"}) + "\n" + '{"prompt": "' + SECRET + '"\n')
    (home / "number.jsonl").write_text('{"prompt": 7}\n')
    (home / "garbage.duckdb").write_bytes(b"not a database\n" * 512)
    (home / "latin1.jsonl").write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    default = yaml.safe_load(DEFAULT_FLEET_PATH.read_text())
    bad = dict(default["deployments"][0], max_num_seq=8)
    (home / "not-yaml.yaml").write_text("schema_version: [1\n")
    (home / "bad-fleet.yaml").write_text(yaml.safe_dump({"schema_version": 1, "deployments": [bad]}))
    remote = dict(default["deployments"][0], name="remote", endpoint="http://127.0.0.1:9")
    (home / "remote.yaml").write_text(yaml.safe_dump({"schema_version": 1, "deployments": [remote]}))


def _check(proc, want: str, home) -> None:
    err = proc.stderr
    assert "Traceback" not in err, err
    assert proc.returncode == 2, (proc.returncode, err)
    lines = err.splitlines()
    error_lines = [line for line in lines if line.startswith("error: ")]
    assert len(error_lines) == 1, err
    assert all(line.startswith("  ") for line in lines[lines.index(error_lines[0]) + 1:]), err
    assert want.format(home=home) in err, err
    assert SECRET not in err  # prompts are user data: messages describe their shape, never quote them


CASES = EMPTY_HOME + GLOBAL + PROFILE + ACCEPTANCE + TABLE_EMPTY + RUN


@pytest.mark.parametrize("args, want", [pytest.param(a, w, id=i) for i, a, w in CASES])
def test_bad_input_is_one_error_line_and_exit_2(home, run_cli, args, want):
    _files(home)
    before = sorted(p.name for p in home.iterdir())
    proc = run_cli(*[a.format(home=home) for a in args])
    _check(proc, want, home)
    assert sorted(p.name for p in home.iterdir()) == before  # a failed command leaves nothing behind


@pytest.mark.parametrize("args, want", [pytest.param(a, w, id=i) for i, a, w in SEEDED])
def test_bad_input_once_a_profile_exists(seeded, home, run_cli, args, want):
    _check(run_cli(*[a.format(home=home) for a in args]), want, home)
