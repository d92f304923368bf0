"""Controller settings at their extremes, and installing a published version all or nothing.

Before: a huge but finite ``hysteresis`` passed the fleet loader and the publish gate, made the
controller fail at start, or on a reload half-installed the new version (state and log said v2, vLLM
kept v1's lookup, and it never recovered); a huge ``poll_every_s`` meant a newer table was never
loaded. Now every numeric setting has bounds (``settings.BOUNDS``, one validation for the fleet, the
publish gate and the controller), and ``Controller._prepare`` builds a version completely before
``_commit`` swaps it in.

Properties (hypothesis): any ``controller:`` mapping the fleet loader accepts is accepted by the
controller and installed at start and on reload (the fleet and the controller never disagree); a
reload during which any building step fails leaves the previous version in force whole (its state,
its lookups and what ``state()`` exports are unchanged, one log line says why), and one during which
nothing fails installs all of the new version.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pickle
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletune_pipelines.controller import evidence, exploration, logic, search, version
from tabletune_pipelines.controller.search import dense_of
from tabletune_pipelines.core.table import vllm_layout
from tabletune_pipelines.formats.controller_settings import BOUNDS, CONTROLLER_POLICIES, ControllerSettings
from tabletune_pipelines.errors import FleetError, SettingsError
from tabletune_pipelines.evaluation.baselines import PolicyController
from tabletune_pipelines.evaluation.simulator import FakeEngine
from tabletune_pipelines.evaluation.synthetic import ENGINE, REBUILD_BUDGET_MS, linear_profile, publish
from tabletune_pipelines.formats.fleet import parse_fleet
from tabletune_pipelines.vocab import CONTROLLER_MODES

PROFILE = linear_profile()
TRUE_T = lambda b, k: PROFILE[k][b]  # noqa: E731
RATES = (0.7, 0.5, 0.3)
V1 = ((1, 8, 3), (9, 16, 1))
V2 = ((1, 4, 2), (5, 16, 0))
ALL_K = [0, 1, 2, 3]


def make(path: Path, clock: list[float]) -> PolicyController:
    """The controller class the vLLM adapter builds (``logic.Controller`` + the ``policy`` setting)."""
    return PolicyController(ENGINE, path, clock=lambda: clock[0], wall=lambda: 1_764_000_000.0 + clock[0])


def fleet_accepts(mapping: dict) -> bool:
    dep = {"name": "a", "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": None,
           "method": "ngram", "max_k": 3, "max_num_seqs": 16, "logged_prompts": "/nonexistent/prompts",
           "published_table": "/nonexistent/a.json", "controller": mapping}
    try:
        parse_fleet({"schema_version": 1, "deployments": [dep]}, source="F.yaml")
    except FleetError:
        return False
    return True


def controller_accepts(mapping: dict) -> bool:
    try:
        ControllerSettings.from_mapping(mapping)
    except SettingsError:
        return False
    return True


# -- the strategy: every setting near and at its bounds, sometimes just outside ------------------------

def _inside(name: str):
    """Values of one setting within its bounds, its two ends (the extremes) drawn often."""
    b = BOUNDS[name]
    if b.integer:
        return st.one_of(st.sampled_from([int(b.low), int(b.high)]), st.integers(int(b.low), int(b.high)))
    ends = [b.high] if b.low_open else [b.low, b.high]
    return st.one_of(st.sampled_from(ends), st.floats(b.low, b.high, exclude_min=b.low_open))


def _outside(name: str):
    """Values just or far outside its bounds, and things that are not numbers of its kind."""
    b = BOUNDS[name]
    if b.integer:
        return st.one_of(st.integers(int(b.high) + 1, 10 ** 30), st.integers(-10 ** 6, int(b.low) - 1),
                         st.sampled_from([float(b.high) * 10, 1e300, 2.5, True]))
    return st.one_of(st.floats(b.high, 1e308, exclude_min=True), st.floats(-1e308, b.low, exclude_max=not b.low_open),
                     st.sampled_from([math.inf, -math.inf, math.nan, 10 ** 400, False]))


OTHER = dict(mode=st.sampled_from(CONTROLLER_MODES), policy=st.sampled_from(CONTROLLER_POLICIES),
             halve_after_rebuild=st.booleans(), prior_decay=st.booleans(), merge_islands=st.booleans(),
             step_time_correction=st.booleans())
# Any subset of the settings (export_path is the fleet's live_counters, not a controller: key there).
INSIDE = st.fixed_dictionaries({}, optional={**{n: _inside(n) for n in BOUNDS}, **OTHER})
ANYTHING = st.fixed_dictionaries({}, optional={**{n: st.one_of(_inside(n), _outside(n)) for n in BOUNDS}, **OTHER})
HYPOTHESIS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lookup_of(ranges) -> list[int]:
    return vllm_layout(dense_of(ranges, ENGINE.max_num_seqs))


def assert_in_force(c: PolicyController, version: int, ranges, mapping: dict) -> None:
    """Version ``version`` is in force whole: its settings, its table, vLLM's lookup and the state
    the controller exports all say so."""
    expected = ControllerSettings.from_mapping({"rebuild_budget_ms": REBUILD_BUDGET_MS, **mapping})
    assert c.fallback_reason is None and c.start is not None
    assert c.start.published.version == version and c.settings == expected
    assert c.ranges == ranges and c.applying
    assert c.table.lookup == lookup_of(ranges)
    st_ = json.loads(json.dumps(c.state()))  # exportable
    assert st_["published_version"] == version and st_["table"] == [list(r) for r in ranges]
    assert st_["mode"] == ("control" if c.controlling else "observe")
    if c.controlling and c.table.hyst:
        assert all(len(lk) == ENGINE.max_num_seqs + 1 for lk in c.table.hyst.values())


@settings(max_examples=200, deadline=None)
@given(mapping=ANYTHING)
def test_the_fleet_loader_and_the_controller_accept_exactly_the_same_settings(mapping):
    # One validation (ControllerSettings): no mapping passes the fleet and is refused by the controller,
    # or the other way round; a value outside its bounds is refused by both, naming it.
    assert fleet_accepts(mapping) == controller_accepts(mapping), mapping
    outside = [n for n in BOUNDS if n in mapping and BOUNDS[n].problem(mapping[n]) is not None and not
               (BOUNDS[n].integer and type(mapping[n]) is float and mapping[n].is_integer() and
                BOUNDS[n].problem(int(mapping[n])) is None)]
    if outside:
        assert not fleet_accepts(mapping)


@HYPOTHESIS
@given(first=INSIDE, second=INSIDE)
def test_any_setting_the_fleet_accepts_installs_at_start_and_on_reload(first, second):
    for mapping in (first, second):
        assert fleet_accepts(mapping) == controller_accepts(mapping), mapping
    # Within the bounds only the cross-field rules (min_prior_weight <= prior_weight, exploration
    # every > run) refuse a mapping; what the fleet refuses is no install to check.
    if not (fleet_accepts(first) and fleet_accepts(second)):
        return
    with tempfile.TemporaryDirectory() as tmp:
        path, clock = Path(tmp) / "pub.json", [1000.0]
        publish(path, ranges=V1, rates=RATES, allowed_k=ALL_K, controller=first)
        c = make(path, clock)
        assert_in_force(c, 1, V1, first)
        FakeEngine(c, RATES, TRUE_T, clock=clock).run(40, 8)
        c.rebuild(clock[0])  # a rebuild with these settings, whatever rebuild_every_steps is
        assert c.errors == 0
        publish(path, ranges=V2, rates=RATES, allowed_k=ALL_K, controller=second, version=2)
        clock[0] += BOUNDS["poll_every_s"].high + 1  # the largest poll interval has passed
        FakeEngine(c, RATES, TRUE_T, clock=clock).run(1, 8)
        assert c.counters.reloads == 1 and c.errors == 0
        assert_in_force(c, 2, V2, second)
        FakeEngine(c, RATES, TRUE_T, clock=clock).run(40, 8)
        c.rebuild(clock[0])
        c.close()
        assert c.errors == 0


# -- all or nothing -----------------------------------------------------------------------------------

#: Everything ``_prepare`` builds a version from, patched in turn to fail on its n-th call.
BUILDERS = ["AcceptanceEstimator", "StepTimeModel", "dense_of", "vllm_layout", "hysteresis_lookups"]
#: The controller modules a version is built in (``version.prepare`` and the parts it builds).
BUILT_IN = (logic, version, evidence, exploration, search)
#: What judging a changed file updates (and the clock, the wall clock and the logger, which do not pickle).
VOLATILE = {"log", "_clock", "watch", "notes"}


def snapshot(c: PolicyController) -> bytes:
    state = {k: v for k, v in vars(c).items() if k not in VOLATILE}
    state["window"] = {k: v for k, v in vars(c.window).items() if k != "wall"}
    return pickle.dumps(state)


@contextlib.contextmanager
def failing_on(name: str, nth: int):
    """``name`` fails from its (nth + 1)-th call on, counted over every module that builds a version;
    yields the count of calls."""
    calls = [0]

    def failing(real):
        def fake(*args, **kwargs):
            calls[0] += 1
            if calls[0] > nth:
                raise OverflowError(f"{name} failed (injected)")
            return real(*args, **kwargs)
        return fake

    with contextlib.ExitStack() as stack:
        for module in BUILT_IN:
            if hasattr(module, name):
                stack.enter_context(mock.patch.object(module, name, failing(getattr(module, name))))
        yield calls


@HYPOTHESIS
@given(builder=st.sampled_from(BUILDERS), nth=st.integers(0, 3),
       second=INSIDE.filter(controller_accepts))
def test_a_reload_installs_all_of_a_new_version_or_none_of_it(builder, nth, second):
    with tempfile.TemporaryDirectory() as tmp:
        path, clock = Path(tmp) / "pub.json", [1000.0]
        publish(path, ranges=V1, rates=RATES, allowed_k=ALL_K, controller={"hysteresis": 3})
        c = make(path, clock)
        FakeEngine(c, RATES, TRUE_T, clock=clock).run(30, 8)
        before, hyst_before = snapshot(c), dict(c.table.hyst)
        publish(path, ranges=V2, rates=RATES, allowed_k=ALL_K, controller=second, version=2)
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        c.log.addHandler(handler)
        try:
            with failing_on(builder, nth) as calls:
                c._poll(clock[0] + 1.0)
                failed = calls[0] > nth
                c._poll(clock[0] + 2.0)  # the same file again: judged once
        finally:
            c.log.removeHandler(handler)
        if failed:
            assert snapshot(c) == before  # nothing of v2, and v1 untouched (counters, estimator, lookups)
            assert c.start.published.version == 1 and c.ranges == V1 and c.table.lookup == lookup_of(V1)
            assert c.table.hyst == hyst_before and c.state()["published_version"] == 1 and c.counters.reloads == 0
            warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
            assert len(warnings) == 1, warnings
            assert "keeping v1 and table [[1,8,3],[9,16,1]]" in warnings[0]
            assert f"{builder} failed (injected)" in warnings[0] and "could not be installed" in warnings[0]
        else:
            assert c.counters.reloads == 1
            assert_in_force(c, 2, V2, second)


# -- worked examples ----------------------------------------------------------------------------------

@pytest.fixture
def clock():
    return [1000.0]


def write_with_settings(path: Path, controller: dict, version: int = 1) -> Path:
    """A published file whose controller settings the publish gate would refuse (written by hand)."""
    publish(path, ranges=V1, rates=RATES, allowed_k=ALL_K, version=version)
    doc = json.loads(path.read_text())
    doc["controller"].update(controller)
    path.write_text(json.dumps(doc))
    return path


def test_the_issues_huge_hysteresis_is_refused_by_the_fleet_and_the_controller(tmp_path, clock, caplog):
    assert not fleet_accepts({"hysteresis": 10 ** 20})
    with pytest.raises(SettingsError, match=r"hysteresis = 100000000000000000000 must be an integer >= 0 and "
                                            r"<= 4096"):
        ControllerSettings.from_mapping({"hysteresis": 10 ** 20})
    # A file written by hand with it: the controller falls back to the engine's table, one line.
    with caplog.at_level(logging.WARNING, logger="tabletune.controller"):
        c = make(write_with_settings(tmp_path / "pub.json", {"hysteresis": 10 ** 20}), clock)
    assert c.start is None and c.next_lookup() is None  # vLLM keeps its configured table
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "using the engine's configured table" in lines[0] and "hysteresis = " in lines[0]


def test_at_the_largest_hysteresis_the_controller_holds_any_k_in_use(tmp_path, clock):
    c = make(publish(tmp_path / "pub.json", ranges=V1, rates=RATES, allowed_k=ALL_K,
                     controller={"hysteresis": 4096}), clock)
    assert c.controlling and c.settings.hysteresis == 4096
    # k = 3 and k = 1 are both in use: holding either keeps it at every batch size.
    assert c.table.hyst[3] == [0] + [3] * 16 and c.table.hyst[1] == [0] + [1] * 16
    assert c.table.hyst[2] == c.table.lookup  # k = 2 is used nowhere: the table's own lookup


def test_a_huge_poll_interval_is_refused_and_the_largest_one_still_loads_a_newer_table(tmp_path, clock):
    assert not fleet_accepts({"poll_every_s": 1e30})
    with pytest.raises(SettingsError, match=r"poll_every_s = 1e\+30 must be a finite number >= 1 and <= 300"):
        ControllerSettings.from_mapping({"poll_every_s": 1e30})
    path = publish(tmp_path / "pub.json", ranges=V1, rates=RATES, allowed_k=ALL_K, controller={"poll_every_s": 300})
    c = make(path, clock)
    eng = FakeEngine(c, RATES, TRUE_T, clock=clock)
    eng.run(1, 8)  # the first poll: nothing new; the next is due 300 s later
    publish(path, ranges=V2, rates=RATES, allowed_k=ALL_K, version=2)
    clock[0] += 299.0
    eng.run(1, 8)
    assert c.start.published.version == 1
    clock[0] += 2.0
    eng.run(1, 8)
    assert c.start.published.version == 2 and c.ranges == V2


def test_a_failed_build_at_start_falls_back_to_the_engines_table_with_one_line(tmp_path, clock, caplog):
    path = publish(tmp_path / "pub.json", ranges=V1, rates=RATES, allowed_k=ALL_K)
    with caplog.at_level(logging.WARNING, logger="tabletune.controller"), failing_on("hysteresis_lookups", 0):
        c = make(path, clock)
    assert c.start is None and c.next_lookup() is None and c.state()["mode"] == "fallback"
    assert c.ranges == ENGINE.launch_ranges
    (line,) = [r.getMessage() for r in caplog.records]
    assert "using the engine's configured table [[1,1,0],[2,2,1],[3,3,2],[4,16,3]]" in line
    assert "(v1) could not be installed (OverflowError: hysteresis_lookups failed (injected))" in line


def test_a_half_install_of_the_old_kind_cannot_happen_on_reload(tmp_path, clock, caplog):
    # The issue's sequence: v1 in force with hysteresis, v2's hysteresis lookups fail. Before, state
    # and log said v2 while vLLM kept v1's hysteresis lookups; now all of v1 stays and a later good
    # v3 is installed whole.
    path = publish(tmp_path / "pub.json", ranges=V1, rates=RATES, allowed_k=ALL_K, controller={"hysteresis": 2})
    c = make(path, clock)
    eng = FakeEngine(c, RATES, TRUE_T, clock=clock)
    eng.run(10, 8)
    handed = c.next_lookup()
    publish(path, ranges=V2, rates=RATES, allowed_k=ALL_K, version=2, controller={"hysteresis": 5})
    with caplog.at_level(logging.INFO, logger="tabletune.controller"), failing_on("hysteresis_lookups", 0):
        clock[0] += 2.0
        eng.run(1, 8)
    assert c.start.published.version == 1 and c.settings.hysteresis == 2 and c.ranges == V1
    assert c.next_lookup() == handed and c.state()["published_version"] == 1
    assert not any("published v2" in r.getMessage() and "loaded" in r.getMessage() for r in caplog.records)
    publish(path, ranges=V2, rates=RATES, allowed_k=ALL_K, version=3, controller={"hysteresis": 5})
    clock[0] += 2.0
    eng.run(1, 8)
    assert c.start.published.version == 3 and c.settings.hysteresis == 5 and c.ranges == V2
    assert c.table.lookup == lookup_of(V2)
