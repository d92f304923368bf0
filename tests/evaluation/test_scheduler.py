"""evaluation.scheduler's anchored plugin (benchmarks/real_engine_eval.py's adaptive launches): what it
is made of, and its anchor switch (the flag file turns the controller off; when the flag goes, the
controller's and its policy's step clocks restart). No engine: the switch runs on a bare instance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from tabletune_pipelines.controller.scheduler import ControllerHooks  # noqa: E402
from tabletune_pipelines.engine.timing_scheduler import TimingHooks  # noqa: E402
from tabletune_pipelines.evaluation import scheduler  # noqa: E402
from tabletune_pipelines.evaluation.baselines import PolicyController  # noqa: E402


def test_the_anchored_plugin_is_the_timing_scheduler_around_the_controller_with_the_baselines():
    cls = scheduler.AnchoredEvaluationScheduler
    assert cls.__mro__[1:3] == (TimingHooks, ControllerHooks)
    assert cls.controller_cls is PolicyController
    assert scheduler.ANCHOR_ENV == "TABLETUNE_EVAL_ANCHOR_FLAG"


def _bare(flag):
    s = object.__new__(scheduler.AnchoredEvaluationScheduler)
    s._ev_flag, s._ev_anchor = flag, False
    s._tt = SimpleNamespace(_last_t=5.0, _prev_b=8, policy=SimpleNamespace(_last_t=7.0))
    return s


def test_the_flag_file_switches_anchor_windows_and_the_clocks_restart_after_one(tmp_path):
    flag = tmp_path / "anchor.on"
    s = _bare(str(flag))
    assert s._ev_check() is False and s._tt._last_t == 5.0  # no flag: nothing changes
    flag.touch()
    assert s._ev_check() is True and s._ev_anchor and s._tt._last_t == 5.0
    flag.unlink()
    assert s._ev_check() is False and not s._ev_anchor
    assert (s._tt._last_t, s._tt._prev_b, s._tt.policy._last_t) == (None, 0, None)


def test_without_a_flag_path_there_is_never_an_anchor(tmp_path):
    s = _bare(None)
    (tmp_path / "anchor.on").touch()
    assert s._ev_check() is False and s._tt._last_t == 5.0
