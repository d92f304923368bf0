"""The fleet reader under hostile input: YAML that means something else
than it says (duplicate keys, aliases, merge keys), values of the right type and a wrong meaning,
files TableTune would write shared with something else, and bytes that are not UTF-8. Each case is
one FleetError naming the file, the deployment or line, and the key; the file is never written."""

from __future__ import annotations

import math

import pytest
import yaml

from tabletune_pipelines.errors import FleetError, TableTuneError
from tabletune_pipelines.formats.fleet import fleet_json_schema, load_fleet, parse_fleet
from tabletune_pipelines.formats.fleet_yaml import MAX_FLEET_BYTES
from tests.readers.conftest import assert_one_error, snapshot

GOOD = """\
schema_version: 1
deployments:
  - name: a
    endpoint: embedded
    gpu: cpu
    model: tiny:small
    drafter: null
    method: ngram
    max_k: 3
    max_num_seqs: 16
    logged_prompts: prompts/a
    published_table: published/a.json
    speculative_config: {prompt_lookup_max: 4}
"""


def dep(**over):
    d = {"name": "a", "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": None,
         "method": "ngram", "max_k": 3, "max_num_seqs": 16, "logged_prompts": "prompts/a",
         "published_table": "published/a.json"}
    d.update(over)
    return d


def load_text(tmp_path, text: str | bytes):
    path = tmp_path / "fleet.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = snapshot(tmp_path)
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert snapshot(tmp_path) == before  # reading a fleet file writes nothing
    assert isinstance(err.value, TableTuneError)
    msg = str(err.value)
    assert msg.startswith(f"fleet file {path}"), msg
    return msg


def test_the_good_file_loads(tmp_path, home):
    (tmp_path / "fleet.yaml").write_text(GOOD)
    assert load_fleet(tmp_path / "fleet.yaml").deployments[0].name == "a"


# -- YAML that does not mean what it looks like ------------------------------------------------------

YAML_CASES = [
    ("duplicate top-level key", GOOD + "schema_version: 1\n", "line 14: key 'schema_version' appears twice"),
    ("duplicate deployment key", GOOD.replace("    max_k: 3\n", "    max_k: 3\n    max_k: 16\n"),
     "line 10: key 'max_k' appears twice in one mapping (first on line 9)"),
    ("duplicate key in a flow mapping", GOOD.replace("{prompt_lookup_max: 4}", "{prompt_lookup_max: 4, prompt_lookup_max: 9}"),
     "line 13: key 'prompt_lookup_max' appears twice"),
    ("duplicate published_table", GOOD + "    published_table: /etc/passwd\n", "key 'published_table' appears twice"),
    ("alias", GOOD.replace("max_k: 3", "max_k: &k 3").replace("max_num_seqs: 16", "max_num_seqs: *k"),
     "line 10: alias *k (a fleet file may not use YAML aliases"),
    ("merge key", GOOD.replace("    speculative_config: {prompt_lookup_max: 4}\n",
                               "    speculative_config:\n      <<: {prompt_lookup_max: 4}\n"), "merge key '<<'"),
    ("billion laughs", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                       "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n", "line 2: alias *a"),
    ("python tag", GOOD + "x: !!python/object/apply:os.system [echo hi]\n", "is not valid YAML"),
    ("not UTF-8", GOOD.encode().replace(b"gpu: cpu", b"gpu: c\xe9u"), "not UTF-8 text (bad byte at offset"),
    ("UTF-16", GOOD.encode("utf-16"), "not UTF-8 text (bad byte at offset 0, line 1)"),
    ("nested too deeply", "x: " + "[" * 20000 + "]" * 20000 + "\n", "nested too deeply"),
]


@pytest.mark.parametrize("name,text,message", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_yaml_that_means_something_else_is_refused(tmp_path, home, name, text, message):
    assert message in load_text(tmp_path, text)


def test_the_byte_offset_and_line_of_a_bad_byte_are_named(tmp_path, home):
    raw = GOOD.encode().replace(b"gpu: cpu", b"gpu: c\xffu")
    msg = load_text(tmp_path, raw)
    offset = raw.index(b"\xff")
    assert f"offset {offset}, line 5" in msg


def test_a_huge_file_and_a_folder_are_refused(tmp_path, home):
    assert "larger than" in load_text(tmp_path, GOOD + "#" * MAX_FLEET_BYTES)
    with pytest.raises(FleetError, match="is a folder"):
        load_fleet(tmp_path)


# -- right type, wrong meaning ------------------------------------------------------------------------

VALUE_CASES = [
    ({"temperature": math.nan}, "'temperature' = nan must be a finite number"),
    ({"temperature": -math.inf}, "'temperature' = -inf must be a finite number"),
    ({"temperature": -0.5}, "'temperature' = -0.5 must be >= 0.0"),
    ({"temperature": 11.0}, "'temperature' = 11.0 must be <= 10.0"),
    ({"max_k": 10_000}, "'max_k' = 10000 must be <= 16"),
    ({"max_k": -3}, "'max_k' = -3 must be >= 1"),
    ({"max_num_seqs": 10**9}, "'max_num_seqs' = 1000000000 must be <= 4096"),
    ({"max_num_seqs": 0}, "'max_num_seqs' = 0 must be >= 1"),
    ({"max_prompts": 10**7}, "'max_prompts' = 10000000 must be <= 100000"),
    ({"max_prompts": True}, "'max_prompts' = True must be an integer"),
    ({"name": ".."}, "'name' = '..' may only use letters"),
    ({"name": "."}, "'name' = '.' may only use letters"),
    ({"name": "a\n"}, "'name' = 'a\\n' may only use letters"),
    ({"name": "-rf"}, "'name' = '-rf' may only use letters"),
    ({"name": ".hidden"}, "must start with a letter or digit"),
    ({"name": "a/../b"}, "'name' = 'a/../b' may only use letters"),
    ({"name": "x" * 64}, "at most 63 characters"),
    ({"engine_group": "../g"}, "'engine_group' = '../g' may only use letters"),
    ({"model": "-x"}, "'model' = '-x' must be a model name or path"),
    ({"model": "--trust-remote-code"}, "vLLM would read a leading '-' as an option"),
    ({"model": "org/model\n--enforce-eager"}, "'model' = 'org/model\\n--enforce-eager' must be a non-empty line"),
    ({"method": "draft_model", "drafter": "-d"}, "'drafter' = '-d' must be a model name or path"),
    ({"gpu": "--x"}, "'gpu' = '--x' must be an accelerator name"),
    ({"gpu": "H100\nA10G"}, "'gpu' = 'H100\\nA10G' must be a non-empty line"),
    ({"dtype": "--enforce-eager"}, "'dtype' = '--enforce-eager' must be one word"),
    ({"dtype": "bfloat16 --enforce-eager"}, "'dtype' = 'bfloat16 --enforce-eager' must be one word"),
    ({"cudagraph_mode": "-"}, "'cudagraph_mode' = '-' must be one word"),
    ({"load_format": "dummy;rm"}, "'load_format' = 'dummy;rm' must be one word"),
    ({"speculative_config": {"method": "eagle"}}, "sets 'method', which it may not override"),
    ({"speculative_config": {"model": "/other"}}, "sets 'model', which it may not override; set it with the "
                                                  "deployment's 'drafter'"),
    ({"speculative_config": {"num_speculative_tokens": 8}}, "set it with the deployment's 'max_k'"),
    ({"speculative_config": {"num_speculative_tokens_per_batch_size": []}}, "TableTune writes the table itself"),
    ({"speculative_config": {"prompt_lookup_max": math.inf}}, "'speculative_config.prompt_lookup_max' = inf must "
                                                             "be a finite number"),
    ({"speculative_config": {"x": {"y": [math.nan]}}}, "'speculative_config.x.y[0]' = nan"),
    ({"controller": {"hystersis": 2}}, "'controller': unknown setting(s) ['hystersis']"),
    ({"controller": {"rebuild_every_steps": 0}}, "rebuild_every_steps = 0 must be an integer >= 1"),
    ({"controller": {"prior_weight": math.nan}}, "'controller.prior_weight' = nan must be a finite number"),
    ({"controller": {"export_path": "/tmp/x.jsonl"}}, "'controller' sets 'export_path', which it may not "
                                                     "override; set the deployment's 'live_counters'"),
    ({"published_table": "a\x00b.json"}, "'published_table' = 'a\\x00b.json' must be a non-empty line"),
    ({"logged_prompts": "p\nq"}, "'logged_prompts' = 'p\\nq' must be a non-empty line"),
    ({"context_levels": []}, "'context_levels' = [] must be a non-empty list of token counts"),
    ({"context_levels": "32,128"}, "'context_levels' = '32,128' must be a non-empty list of token counts"),
    ({"context_levels": {"a": 32}}, "'context_levels' = {'a': 32} must be a non-empty list"),
    ({"context_levels": [128, 32]}, "'context_levels' = [128, 32] must be strictly ascending"),
    ({"context_levels": [32, 32]}, "'context_levels' = [32, 32] must be strictly ascending"),
    ({"context_levels": [32, True]}, "'context_levels[1]' = True must be an integer >= 1"),
    ({"context_levels": [0]}, "'context_levels[0]' = 0 must be an integer >= 1"),
    ({"context_levels": [32, 2 ** 40]}, "'context_levels[1]' = 1099511627776 must be an integer >= 1 and <= "
                                        "16777216"),
    ({"context_levels": [32.5]}, "'context_levels[0]' = 32.5 must be an integer"),
    ({"context_levels": [math.nan]}, "'context_levels[0]' = nan must be an integer"),
    ({"context_levels": ["64"]}, "'context_levels[0]' = '64' must be an integer"),
]


@pytest.mark.parametrize("over,message", VALUE_CASES, ids=[str(sorted(c[0]))[:40] for c in VALUE_CASES])
def test_values_with_the_right_type_and_a_wrong_meaning(over, message):
    with pytest.raises(FleetError) as err:
        parse_fleet({"schema_version": 1, "deployments": [dep(**over)]}, source="F.yaml")
    (line,) = str(err.value).splitlines()
    assert line.startswith("fleet file F.yaml, deployment") and message in line, line


def test_bounds_and_reserved_keys_are_in_the_declared_schema():
    props = fleet_json_schema()["$defs"]["Deployment"]["properties"]
    assert props["max_prompts"]["maximum"] == 100_000 and props["temperature"]["maximum"] == 10.0
    assert props["max_k"]["maximum"] == 16 and props["max_num_seqs"]["maximum"] == 4096
    assert "not method, model, num_speculative_tokens or the table" in props["speculative_config"]["description"]
    assert "except export_path" in props["controller"]["description"]
    assert props["speculative_config"]["propertyNames"]["not"]["enum"] == [
        "method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"]
    assert props["controller"]["propertyNames"]["not"]["enum"] == ["export_path"]


# -- files TableTune writes: never shared -----------------------------------------------------------

def test_two_deployments_never_share_a_file_tabletune_writes(tmp_path, home):
    def refused(*deps):
        with pytest.raises(FleetError) as err:
            parse_fleet({"schema_version": 1, "deployments": list(deps)}, source="F.yaml", base_dir=tmp_path)
        return str(err.value)

    b = dict(name="b", logged_prompts="prompts/b")
    assert "deployment 'b': published_table = " in refused(dep(), dep(**b))
    assert "is also deployment 'a''s published_table" in refused(dep(), dep(**b))
    # b's published table is a's speculative-config companion (published/a.speculative-config.json).
    msg = refused(dep(), dep(**b, published_table="published/a.speculative-config.json"))
    assert "is also deployment 'a''s published_table's speculative-config companion" in msg
    msg = refused(dep(live_counters="published/a.json"))
    assert "live_counters = " in msg and "is also deployment 'a''s published_table" in msg
    msg = refused(dep(), dep(**b, published_table="published/b.json", live_counters="published/a.json"))
    assert "deployment 'b': live_counters" in msg


def test_the_store_and_the_fleet_file_are_never_a_published_table(tmp_path, home):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(GOOD.replace("published/a.json", str(fleet)))
    msg = load_text(tmp_path, fleet.read_bytes())
    assert "published_table = " in msg and "is also the fleet file itself" in msg
    store = home / "tabletune_store.duckdb"
    msg = load_text(tmp_path, GOOD.replace("published/a.json", str(store)))
    assert "is also the DuckDB store (TABLETUNE_DUCKDB)" in msg


# -- the CLI shows one error line, no traceback --------------------------------------------------------

@pytest.mark.parametrize("name,text,message", [YAML_CASES[1], YAML_CASES[4], YAML_CASES[8]],
                         ids=["duplicate", "alias", "not-utf8"])
def test_the_cli_names_the_problem_without_a_traceback(run_cli, home, name, text, message):
    path = home / "fleet.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", path, "show"), str(path), message)
    assert snapshot(home) == before


def test_bad_context_levels_through_the_cli_write_nothing(run_cli, home):
    path = home / "fleet.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "deployments": [dep(context_levels=[512, 64])]}))
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", path, "profile", "--dry-run"), "deployment 'a'",
                     "'context_levels' = [512, 64] must be strictly ascending")
    assert snapshot(home) == before and not (home / "tabletune_store.duckdb").exists()


def test_a_value_case_through_the_cli(run_cli, home):
    path = home / "fleet.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "deployments": [dep(model="--trust-remote-code")]}))
    assert_one_error(run_cli("--fleet", path, "table"), "deployment 'a'", "'model' = '--trust-remote-code'")
    assert not (home / "tabletune_store.duckdb").exists()
