"""ProfileOptions, ProfilePlan and the launches a plan needs."""

from __future__ import annotations

import pytest

from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.plan import (
    ProfileOptions,
    ProfilePlan,
    default_plan,
    fixed_k_baseline_options,
    fixed_k_config,
    launch_table,
    no_spec_config,
    per_k_config,
    plan_from_options,
    rotations,
    switching_config,
)
from tabletune_pipelines.errors import EngineConfigError

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, max_num_seqs=32,
                   load_format="dummy", model_runner="v2")


def test_k_order_rotates_across_repetitions():
    assert rotations([0, 1, 3], 3) == [[0, 1, 3], [1, 3, 0], [3, 0, 1]]
    assert rotations([None], 2) == [[None], [None]]


def test_default_plan():
    plan = default_plan(CFG)
    assert plan.ks == (0, 1, 2, 3) and plan.batch_sizes == tuple(range(1, 17)) + (24, 32)
    assert plan.accept_batch_sizes == (1, 10, 32) and plan.repetitions == 3
    plan = default_plan(CFG, batch_sizes=[8, 1, 8], ks=[3, 0], accept_batch_sizes=[])
    assert plan.batch_sizes == (1, 8) and plan.ks == (0, 3) and plan.accept_batch_sizes == ()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_sizes": [0]}, "batch size 0 is outside 1..max_num_seqs = 32"),
    ({"batch_sizes": [33]}, "batch size 33"),
    ({"batch_sizes": []}, "batch_sizes is empty"),
    ({"ks": [4]}, "k = 4 is outside 0..num_speculative_tokens = 3"),
    ({"repetitions": 0}, "repetitions = 0"),
    ({"accept_batch_sizes": [64]}, "accept batch size 64"),
])
def test_default_plan_names_the_bad_value(kwargs, message):
    with pytest.raises(EngineConfigError, match=message):
        default_plan(CFG, **kwargs)


def test_plan_cells_per_mode():
    plan = ProfilePlan(batch_sizes=(1, 8), ks=(0, 1, 3), repetitions=2, accept_batch_sizes=(1,))
    assert plan.cells("fixed_k") == [(1, 1, "reject"), (3, 1, "reject"), (1, 8, "reject"), (3, 8, "reject")]
    cells = plan.cells("one_launch")
    assert cells[:3] == [(0, 1, "reject"), (1, 1, "reject"), (3, 1, "reject")]
    assert (None, 8, "reject") in cells and (1, 1, "accept") in cells and (0, 1, "accept") not in cells
    assert len(cells) == 6 + 2 + 2


def test_options_defaults_and_mapping():
    opts = ProfileOptions()
    assert opts.mode == "one_launch" and opts.repetitions == 3 and opts.warmup is None
    opts = ProfileOptions.from_mapping({"mode": "launch_per_k", "batch_sizes": [1, 4], "ks": [0, 1],
                                        "startup_timeout": 600, "warmup": True})
    assert opts.batch_sizes == (1, 4) and opts.ks == (0, 1) and opts.warmup is True
    assert opts.server_overrides() == {"startup_timeout": 600}
    assert opts.apply_to(CFG).startup_timeout == 600 and opts.apply_to(CFG).load_format == "dummy"
    assert ProfileOptions().apply_to(CFG) is CFG
    plan = plan_from_options(CFG, opts)
    assert plan.batch_sizes == (1, 4) and plan.ks == (0, 1)


@pytest.mark.parametrize(("data", "message"), [
    ({"modes": "one_launch"}, r"my options: unknown key\(s\) \['modes'\]; known keys: \[.*'mode', "),
    ({"mode": "per_k"}, "mode = 'per_k' must be one of"),
    ({"batch_sizes": "1,4"}, "batch_sizes = '1,4' must be a list of integers"),
    ({"ks": [0, 1.5]}, r"ks = \[0, 1.5\]: 1.5 is not an integer"),
    ({"repetitions": 0}, "repetitions = 0"),
    ({"include_no_spec": "yes"}, "include_no_spec = 'yes' must be true or false"),
    ({"warmup": 1}, "warmup = 1"),
    # Finite but meaningless: every number has an upper bound too.
    ({"repetitions": 10 ** 12}, r"repetitions = 1000000000000 must be an integer >= 1 and <= 100"),
    ({"max_repetitions": 101}, r"max_repetitions = 101 must be an integer >= 1 and <= 100"),
    ({"remeasure_budget_s": 1e300}, r"remeasure_budget_s = 1e\+300 must be a finite number >= 0 and <= 86400"),
    ({"remeasure_budget_s": float("inf")}, r"remeasure_budget_s = inf must be a finite number"),
    ({"remeasure_budget_s": True}, r"remeasure_budget_s = True must be a finite number"),
    ({"startup_timeout": 1e300}, r"startup_timeout = 1e\+300 must be a finite number >= 1 and <= 3600"),
    ({"startup_timeout": 0}, r"startup_timeout = 0 must be a finite number >= 1"),
    ({"prompt_tokens": 10 ** 6}, r"prompt_tokens = 1000000 must be an integer >= 1 and <= 32768"),
    ({"kv_cache_space_gib": 10 ** 6}, r"kv_cache_space_gib = 1000000 must be an integer >= 1 and <= 4096"),
    ({"max_model_len": 2 ** 40}, r"max_model_len = 1099511627776 must be an integer >= 1 and <= 16777216"),
    ({"decode_steps": 4}, r"decode_steps = 4 must be an integer >= 8 and <= 1024"),
    ({"coarse_points": 1}, r"coarse_points = 1 must be an integer >= 2 and <= 64"),
    ({"coarse_points": 2.5}, r"coarse_points = 2.5 must be an integer"),
])
def test_options_name_the_bad_key_or_value(data, message):
    with pytest.raises(EngineConfigError, match=message):
        ProfileOptions.from_mapping(data, where="my options")


def test_warmup_default_depends_on_the_device():
    assert ProfileOptions().warmup_for("gpu") is True
    assert ProfileOptions().warmup_for("cpu") is False
    assert ProfileOptions(warmup=False).warmup_for("gpu") is False
    assert ProfileOptions(warmup=True).warmup_for("cpu") is True


def test_fixed_k_baseline_options():
    plan = default_plan(CFG)
    fk = fixed_k_baseline_options(ProfileOptions(fixed_k_baseline=True, repetitions=2), plan)
    assert fk.mode == "fixed_k" and fk.ks == (1, 2, 3) and fk.repetitions == 2
    assert fk.batch_sizes == (1, 5, 10, 32) and fk.accept_batch_sizes == () and not fk.include_no_spec
    assert not fk.fixed_k_baseline
    # Only the k asked for: one launch each.
    assert fixed_k_baseline_options(ProfileOptions(fixed_k_baseline=True, fixed_k_ks=[3, 1]), plan).ks == (1, 3)
    with pytest.raises(EngineConfigError, match=r"fixed_k_ks = \[3\]: \[3\] not among the plan's k >= 1 \[1, 2\]"):
        fixed_k_baseline_options(ProfileOptions(fixed_k_baseline=True, fixed_k_ks=[3]), default_plan(CFG, ks=[0, 1, 2]))
    for bad in ([0], [], [65], [1.5], "3"):
        with pytest.raises(EngineConfigError, match="fixed_k_ks"):
            ProfileOptions.from_mapping({"fixed_k_ks": bad})


def test_launch_table_lists_every_k():
    assert launch_table([0, 1, 2, 3], 16) == ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 16, 3))
    assert launch_table([3, 0, 1], 8) == ((1, 1, 0), (2, 2, 1), (3, 8, 3))
    assert launch_table([2], 8) == ((1, 8, 2),)
    with pytest.raises(EngineConfigError, match="ks = \\[0, 1, 2, 3\\] has 4 values but max_num_seqs = 2"):
        launch_table([0, 1, 2, 3], 2)


def test_launch_configs():
    sw = switching_config(CFG, (0, 1, 3), 0.0, "/w")
    assert sw.table == ((1, 1, 0), (2, 2, 1), (3, 32, 3)) and sw.synthetic_acceptance_rates == (0.0, 0.0, 0.0)
    assert sw.num_speculative_tokens == 3 and sw.work_dir == "/w"
    assert sw.load_format == "dummy" and sw.model_runner == "v2"  # the GPU options travel to every launch
    assert switching_config(CFG, (1, 3), 1.0, None).synthetic_acceptance_rates == (1.0, 1.0, 1.0)
    pk = per_k_config(CFG, 1, None)
    assert pk.table == ((1, 32, 1),) and pk.num_speculative_tokens == 3
    fk = fixed_k_config(CFG, 2, None)
    assert fk.table is None and fk.num_speculative_tokens == 2 and fk.synthetic_acceptance_rates == (0.0, 0.0)
    ns = no_spec_config(CFG, None)
    assert ns.method is None and ns.speculative_config is None and ns.load_format == "dummy"


def test_the_largest_values_are_allowed_and_the_engine_ranges_are_one_rule():
    from tabletune_pipelines.engine.plan import PROFILE_LIMITS

    top = ProfileOptions.from_mapping({n: (int(b.high) if b.integer else b.high) for n, b in PROFILE_LIMITS.items()})
    assert top.repetitions == 100 and top.remeasure_budget_s == 86_400.0 and top.startup_timeout == 3_600.0
    opts = ProfileOptions(batch_sizes=(1, 8), ks=(0, 3), accept_batch_sizes=(1, 64))
    opts.check_engine(64, 3)
    with pytest.raises(EngineConfigError, match=r"accept batch size 64 is outside 1..max_num_seqs = 32 \(dep\)"):
        opts.check_engine(32, 3, " (dep)")
    with pytest.raises(EngineConfigError, match="k = 3 is outside 0..num_speculative_tokens = 2"):
        opts.check_engine(64, 2)
    # The plan refuses the same value with the same words (one rule).
    with pytest.raises(EngineConfigError, match="accept batch size 64 is outside 1..max_num_seqs = 32"):
        plan_from_options(CFG, opts)


def test_plan_and_options_fields_are_declared_once():
    """``PlanFields`` declares what a plan and the options share, ``LaunchOverrides`` the server settings
    ``ProfileOptions`` and ``AcceptanceOptions`` share; no class redeclares one (each has one docstring)."""
    import dataclasses

    from tabletune_pipelines.tuning.deployments import AcceptanceOptions
    from tabletune_pipelines.engine.plan import LaunchOverrides, PlanFields
    from tabletune_pipelines.options import field_docs

    shared = {f.name for f in dataclasses.fields(PlanFields)}
    launch = {f.name for f in dataclasses.fields(LaunchOverrides)}
    assert shared == {"batch_sizes", "ks", "repetitions", "include_no_spec", "accept_batch_sizes", "prompt_tokens",
                      "context_levels", "decode_steps"}
    assert launch == {"startup_timeout", "kv_cache_space_gib", "max_model_len"}
    for cls, bases in ((ProfilePlan, shared), (ProfileOptions, shared | launch), (AcceptanceOptions, launch)):
        assert bases <= {f.name for f in dataclasses.fields(cls)}
        assert not bases & set(vars(cls).get("__annotations__", {})), f"{cls.__name__} redeclares a shared field"
    assert set(field_docs(PlanFields)) == shared and set(field_docs(LaunchOverrides)) == launch


def test_a_plan_resolves_the_accept_default_as_the_options_do():
    assert ProfilePlan(batch_sizes=(8, 1, 4), ks=(0, 1)).accept_batch_sizes == (1, 4, 8)
    assert ProfilePlan(batch_sizes=(1, 8), ks=(0, 1), accept_batch_sizes=()).accept_batch_sizes == ()
    assert ProfilePlan(batch_sizes=[1, 8], ks=[0, 1]).batch_sizes == (1, 8)
    with pytest.raises(EngineConfigError, match="holds its batch sizes and ks"):
        ProfilePlan(ks=(0, 1))
    with pytest.raises(EngineConfigError, match="repetitions = 0"):
        ProfilePlan(batch_sizes=(1,), ks=(0,), repetitions=0)
    with pytest.raises(EngineConfigError, match="include_no_spec = 'no' must be true or false"):
        ProfilePlan(batch_sizes=(1,), ks=(0,), include_no_spec="no")


def test_launch_overrides_are_one_rule_for_profile_and_acceptance_options():
    from tabletune_pipelines.tuning.deployments import AcceptanceOptions

    for cls in (ProfileOptions, AcceptanceOptions):
        opts = cls(startup_timeout=60, max_model_len=1024)
        assert opts.server_overrides() == {"startup_timeout": 60, "max_model_len": 1024}
        cfg = opts.apply_to(CFG)
        assert (cfg.startup_timeout, cfg.max_model_len, cfg.kv_cache_space_gib) == (60, 1024, CFG.kv_cache_space_gib)
        assert cls().apply_to(CFG) is CFG
        with pytest.raises(EngineConfigError, match="kv_cache_space_gib = 0 must be an integer >= 1"):
            cls(kv_cache_space_gib=0)


def test_the_first_pass_and_the_repetition_length_are_the_options():
    from tabletune_pipelines.engine.plan import plan_from_options, plan_lines

    cfg = ServerConfig(model="/m", method="ngram", num_speculative_tokens=3, max_num_seqs=16)
    opts = ProfileOptions(coarse_points=3, decode_steps=32)
    plan = plan_from_options(cfg, opts)
    assert plan.decode_steps == 32 and plan.accept_batch_sizes == (1, 9, 16)  # the ends and middle of B 1, 9, 16
    lines = plan_lines(plan, opts)
    assert "3 repetitions of 32 decode steps" in lines[0] and "first pass B [1, 9, 16] (" in lines[1]
    assert "first pass B [1, 5, 9, 12, 16] (" in plan_lines(plan_from_options(cfg, ProfileOptions()),
                                                             ProfileOptions())[1]
