"""The one step-cost model: graph modes, prefill fits and the served expectation, with worked numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.stepcost import (
    GraphEnvelope,
    PrefillFit,
    StepCost,
    StepSample,
    Workload,
    fit_prefill_costs,
    samples_from_step_log,
    unmeasured_cells,
)
from tabletune_pipelines.core.served_calibration import ServedCalibration, ServedPoint
from tabletune_pipelines.errors import InvalidValueError

H200 = GraphEnvelope("full_and_piecewise", capture_ceiling=512, max_num_batched_tokens=8192)
CPU = GraphEnvelope("none")


def test_graph_modes_on_a_full_and_piecewise_gpu():
    assert H200.transition(512, 0) == "full>full"        # k = 3 at B = 128 is exactly the ceiling
    assert H200.transition(512, 1) == "full>none"        # one prefill token more falls off the graphs
    assert H200.transition(256, 32) == "full>piecewise"  # a mixed step never gets a FULL graph
    assert H200.transition(600, 0) == "none>none"
    assert GraphEnvelope("default", 512).transition(100, 10) == "full>piecewise"  # undeclared = vLLM's default
    assert GraphEnvelope("piecewise", 512).transition(100, 0) == "piecewise>piecewise"
    assert CPU.transition(10, 100) == "none>none"


def test_envelope_rejects_bad_values():
    with pytest.raises(InvalidValueError, match="capture_ceiling = 0"):
        GraphEnvelope("full", capture_ceiling=0)
    with pytest.raises(InvalidValueError, match="output_tokens"):
        Workload(prompt_tokens=32, output_tokens=0)
    with pytest.raises(InvalidValueError, match="prompt_tokens = nan"):
        Workload(prompt_tokens=float("nan"), output_tokens=10)


def test_a_workload_reads_in_words_and_survives_its_dict():
    w = Workload(prompt_tokens=32, output_tokens=80.5, source="logged")
    assert w.describe() == "32-token prompts and 80.5-token outputs"
    assert Workload.from_dict(w.to_dict()) == w


def _surface(n=8, ks=(0, 1, 3)):
    # T_dec = 2 + 0.1·B·(1 + k) ms
    b = np.arange(1, n + 1)
    return np.vstack([2.0 + 0.1 * b * (1 + k) for k in ks])


def test_fit_recovers_a_known_extra_cost():
    ks = (0, 1, 3)
    dec = _surface()
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(60):
        b, k = int(rng.integers(1, 9)), int(rng.choice(ks))
        p = int(rng.integers(1, 400))
        d = b * (1 + k)
        true = dec[ks.index(k), b - 1] + 0.5 + 0.01 * d + 0.02 * p
        samples.append(StepSample(batch=b, k=k, decode_tokens=d, prefill_tokens=p, ms=true + rng.normal(0, 0.01)))
    samples.append(StepSample(batch=4, k=1, decode_tokens=8, prefill_tokens=100, ms=500.0))  # a pause
    fits = fit_prefill_costs(samples, lambda k, b: dec[ks.index(k), b - 1], CPU)
    assert list(fits) == ["none>none"]
    f = fits["none>none"]
    assert f.coef == pytest.approx((0.5, 0.01, 0.02), abs=0.01)
    assert f.n == 60  # the pause was dropped
    a_se = math.sqrt(f.cov[0][0])
    assert 0 < a_se < 0.05
    assert PrefillFit.from_dict(f.to_dict()) == f


def test_pure_steps_of_varying_drafts_price_each_mixed_step_at_its_own_decode_tokens():
    """n-gram lookup drafts fewer than k for part of a batch: at B = 15, k = 3 the pure steps carry
    15..60 decode tokens, costing 20 + 0.5 ms a token. A mixed step of D decode tokens and P prompt
    tokens costs its pure step plus 1 + 0.03·P ms. Against the pure steps' median (the pure step at
    the median D) every mixed step with another D would read 0.5 ms a token too high or low; priced
    at its own D the fit recovers the extra exactly. The surface (``decode_ms``) is never asked."""
    rng = np.random.default_rng(1)
    ds = [15, 60, *rng.integers(15, 61, 38)]
    pure = [StepSample(15, 3, int(d), 0, 20.0 + 0.5 * int(d)) for d in ds]
    mixed = [StepSample(15, 3, int(d), p, 20.0 + 0.5 * int(d) + 1.0 + 0.03 * p)
             for d, p in zip(rng.integers(15, 61, 12), (16, 64, 256) * 4)]

    def never(k, b):
        raise AssertionError("the surface is not the base where the batch's own pure steps are")

    f = fit_prefill_costs(pure + mixed, never, CPU)["none>none"]
    assert f.coef[0] == pytest.approx(1.0, abs=1e-6) and f.coef[2] == pytest.approx(0.03, abs=1e-8)
    assert f.coef[1] == pytest.approx(0.0, abs=1e-8)  # the extra does not grow with D: the base carries it
    assert f.n == 12 and f.decode_tokens_range[1] - f.decode_tokens_range[0] > 20


def test_pure_steps_of_one_draft_count_are_the_median_base():
    pure = [StepSample(4, 1, 8, 0, ms) for ms in (5.0, 5.0, 5.2, 9.0, 5.1, 4.9)]
    mixed = [StepSample(4, 1, 8, p, 5.0 + 0.5 + 0.01 * p) for p in (10, 20, 40, 80, 160, 320)]
    f = fit_prefill_costs(pure + mixed, lambda k, b: 100.0, CPU)["none>none"]
    assert f.coef[0] == pytest.approx(0.5 - 0.05) and f.coef[2] == pytest.approx(0.01)  # median 5.05


def test_a_prefill_fit_range_that_is_not_a_pair_is_refused():
    fit = PrefillFit(transition="none>none", coef=(0.5, 0.01, 0.02), cov=((1.0, 0.0, 0.0),) * 3, n=12,
                     rmse_ms=0.1, decode_tokens_range=(2, 16), prefill_tokens_range=(1, 399))
    assert PrefillFit.from_dict(fit.to_dict()).prefill_tokens_range == (1, 399)
    bad = {**fit.to_dict(), "prefill_tokens_range": [1, 200, 399]}
    with pytest.raises(InvalidValueError, match=r"'none>none': prefill_tokens_range \[1, 200, 399\] must be"):
        PrefillFit.from_dict(bad)


def test_a_term_that_does_not_vary_is_held_at_zero():
    dec = _surface(ks=(1,))
    samples = [StepSample(4, 1, 8, p, dec[0, 3] + 1.0 + 0.01 * p) for p in (10, 20, 40, 80, 160, 320)]
    f = fit_prefill_costs(samples, lambda k, b: dec[0, b - 1], CPU)["none>none"]
    assert f.coef[1] == 0.0 and f.cov[1][1] == 0.0
    assert f.coef[0] == pytest.approx(1.0) and f.coef[2] == pytest.approx(0.01)


def test_too_few_mixed_steps_give_no_fit():
    samples = [StepSample(1, 1, 2, 10, 5.0)] * 5
    assert fit_prefill_costs(samples, lambda k, b: 2.0, CPU) == {}


def _fit(tr, a, b, c):
    return PrefillFit(transition=tr, coef=(a, b, c), cov=((0.0,) * 3,) * 3, n=10, rmse_ms=0.0,
                      decode_tokens_range=(1, 512), prefill_tokens_range=(1, 1000))


def test_step_cost_crosses_the_ceiling_as_a_discontinuity():
    ks = (1, 3)
    n = 128
    dec = np.vstack([np.full(n, 8.0), np.full(n, 10.0)])
    cost = StepCost(ks=ks, decode_ms=dec, envelope=H200,
                    fits={"full>piecewise": _fit("full>piecewise", 1.0, 0.0, 0.01),
                          "full>none": _fit("full>none", 20.0, 0.0, 0.01)})
    # B = 128, k = 3: D = 512. 0 prefill: 10 ms. 32 prefill tokens: over the ceiling: 10 + 20 + 0.32.
    assert cost.step_ms(128, 3, 0) == pytest.approx(10.0)
    assert cost.step_ms(128, 3, 32) == pytest.approx(30.32)
    # B = 64, k = 3: D = 256; 32 prefill tokens stay under: piecewise, 10 + 1 + 0.32.
    assert cost.step_ms(64, 3, 32) == pytest.approx(11.32)
    # B = 128, k = 1: D = 256 + 32 = 288 < 512.
    assert cost.step_ms(128, 1, 32) == pytest.approx(9.32)


def test_served_expectation_is_the_poisson_mixture():
    ks = (1,)
    dec = np.full((1, 4), 10.0)
    cost = StepCost(ks=ks, decode_ms=dec, envelope=CPU, fits={"none>none": _fit("none>none", 2.0, 0.0, 0.1)})
    w = Workload(prompt_tokens=20, output_tokens=50)
    sc = cost.served([0.5], w)
    # B = 4, tau(1) = 1.5: lambda = 4·1.5/50 = 0.12; E[extra] = sum_n p(n)·(2 + 0.1·20·n)
    #   = 2·(1 − e^-λ) + 2·λ
    lam = 0.12
    want = 10.0 + 2.0 * (1 - math.exp(-lam)) + 2.0 * lam
    assert sc.arrivals[0, 3] == pytest.approx(lam)
    assert sc.ms[0, 3] == pytest.approx(want, rel=1e-9)
    assert np.all(sc.unmeasured == 0)
    assert np.array_equal(cost.served([0.5], None).ms, dec)


def test_unmeasured_transitions_are_reported_not_priced_as_free():
    ks = (1, 3)
    dec = np.vstack([np.full(128, 8.0), np.full(128, 10.0)])
    cost = StepCost(ks=ks, decode_ms=dec, envelope=H200, fits={"full>piecewise": _fit("full>piecewise", 1.0, 0.0, 0.01)})
    sc = cost.served([0.7, 0.5, 0.3], Workload(prompt_tokens=32, output_tokens=96))
    cells = unmeasured_cells(sc, ks, [3] * 128)
    bs = [b for b, _, _ in cells]
    # k = 3 at B = 128 (D = 512) crosses the ceiling with any arrival: 1 − e^-λ, λ = 128·2.5/96.
    assert cells[-1][0] == 128 and cells[-1][2] == pytest.approx(1 - math.exp(-128 * 2.5 / 96))
    # At B = 81 (D = 324) it takes 6 arrivals of 32 tokens: P(n >= 6 | λ = 2.11) ≈ 1.6 %.
    lam = 81 * 2.5 / 96
    p6 = 1 - sum(math.exp(-lam) * lam ** j / math.factorial(j) for j in range(6))
    assert dict((b, p) for b, _, p in cells)[81] == pytest.approx(p6) and min(bs) == 81
    assert unmeasured_cells(sc, ks, [1] * 128) == []


def test_samples_from_a_step_log():
    log = [
        {"t": 0.0, "dt": None, "b": 4, "k": 2, "d": 8, "new": 4, "tok": 4 * 32},  # first step: no interval
        {"t": 0.1, "dt": 5.0, "b": 4, "k": 2, "d": 8, "new": 0, "tok": 12},       # pure decode
        {"t": 0.2, "dt": 7.0, "b": 6, "k": 2, "d": 8, "new": 2, "tok": 12 + 64},  # 2 arrivals of 32
        {"t": 0.3, "dt": 5.0, "b": 4, "k": 2, "d": 6, "new": 0, "tok": 10},       # one request drafted 0
        {"t": 0.9, "dt": 600.0, "b": 0},
    ]
    s = samples_from_step_log(log)
    assert s == [StepSample(4, 2, 12, 0, 5.0), StepSample(4, 2, 12, 64, 7.0)]
    assert len(samples_from_step_log(log, full_drafts=False)) == 3


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 2000), st.floats(1, 2000), st.floats(0, 1), st.floats(0, 0.1))
def test_served_cost_never_below_decode_and_grows_with_prompts(l_in, l_out, a, c):
    ks = (0, 1)
    dec = np.vstack([np.full(16, 5.0), np.full(16, 6.0)])
    cost = StepCost(ks=ks, decode_ms=dec, envelope=CPU, fits={"none>none": _fit("none>none", 0.5, 0.0, c)})
    lo = cost.served([a], Workload(l_in, l_out)).ms
    hi = cost.served([a], Workload(l_in * 2, l_out)).ms
    assert np.all(lo >= dec - 1e-9)
    assert np.all(hi >= lo - 1e-9)


# ----------------------------------------------------------------------------- served calibration
def test_calibration_offsets_worked_numbers():
    priced = np.array([[10.0] * 10, [12.0] * 10])          # ks (1, 2), B = 1..10
    cal = ServedCalibration(points=(ServedPoint(k=1, batch=4, ms=12.0, se_ms=0.5, rounds=3),
                                    ServedPoint(k=1, batch=8, ms=16.0, se_ms=1.0, rounds=3)))
    off, var, cross = cal.offsets(priced, np.zeros_like(priced), (1, 2))
    # k = 1: +2 at B = 4, +6 at B = 8, linear between, flat above, proportional to B below.
    assert off[0].tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 6.0])
    assert var[0, 3] == pytest.approx(0.25) and var[0, 7] == pytest.approx(1.0) and var[0, 5] == pytest.approx(0.625)
    # k = 2 has no point: it borrows k = 1's offset (the mean of one), with k = 1's variance (spread 0).
    assert off[1].tolist() == pytest.approx(off[0].tolist()) and var[1].tolist() == pytest.approx(var[0].tolist())
    assert not cross.any()  # no load recorded: nothing paired


def test_calibration_pairs_ks_measured_in_the_same_rounds():
    rounds_a = (("r0", 10.0), ("r1", 12.0), ("r2", 14.0))
    rounds_b = (("r0", 20.0), ("r1", 23.0), ("r2", 26.0))
    a = ServedPoint(k=1, batch=5, ms=12.0, se_ms=2 / math.sqrt(3), rounds=3, load=6, per_round=rounds_a)
    b = ServedPoint(k=2, batch=5, ms=23.0, se_ms=3 / math.sqrt(3), rounds=3, load=6, per_round=rounds_b)
    priced = np.array([[10.0] * 8, [20.0] * 8])
    off, var, cross = ServedCalibration(points=(a, b)).offsets(priced, np.zeros_like(priced), (1, 2))
    # per-window covariance 6 over 3 shared rounds, for means of 3 each: 6·3 / 9 = 2 = sd_a·sd_b (correlation 1)
    assert cross[0, 1, 4] == pytest.approx(2.0) and cross[1, 0, 4] == pytest.approx(2.0)
    assert cross[0, 0].tolist() == [0.0] * 8
    assert var[0, 4] == pytest.approx(4 / 3) and var[1, 4] == pytest.approx(3.0)
    assert off[:, 4].tolist() == pytest.approx([2.0, 3.0])


def test_calibrated_served_cost_is_the_measurement_at_its_point():
    cost = StepCost(ks=(0, 1), decode_ms=np.array([[5.0] * 8, [6.0] * 8]), envelope=CPU)
    wl = Workload(prompt_tokens=16, output_tokens=40)
    cal = ServedCalibration(points=(ServedPoint(k=1, batch=6, ms=9.0, se_ms=0.2, rounds=4),))
    priced = cost.served((0.6,), wl)
    served = cost.served((0.6,), wl, cal)
    assert served.ms[1, 5] == pytest.approx(9.0)
    assert served.offset_ms is not None and served.offset_ms[1, 5] == pytest.approx(9.0 - priced.ms[1, 5])
    assert served.calibration is cal and priced.calibration is None
    assert ServedCalibration.from_dict(cal.to_dict()) == cal


@pytest.mark.parametrize("bad, match", [
    (dict(k=-1), "k = -1"), (dict(ms=0.0), "ms = 0.0"), (dict(rounds=1), "at least 2"),
    (dict(se_ms=float("nan")), "se_ms"), (dict(batch=0.5), "batch = 0.5"),
])
def test_served_point_names_the_bad_value(bad, match):
    with pytest.raises(InvalidValueError, match=match):
        ServedPoint(**{**dict(k=1, batch=4.0, ms=10.0, se_ms=0.1, rounds=3), **bad})


def test_calibration_rejects_a_k_the_model_does_not_price_and_duplicates():
    p = ServedPoint(k=3, batch=4, ms=10.0, se_ms=0.1, rounds=2)
    with pytest.raises(InvalidValueError, match="k = \\[3\\]"):
        ServedCalibration(points=(p,)).offsets(np.ones((2, 8)), np.zeros((2, 8)), (0, 1))
    with pytest.raises(InvalidValueError, match="two points"):
        ServedCalibration(points=(p, p))
    with pytest.raises(InvalidValueError, match="at least one point"):
        ServedCalibration(points=())


@settings(max_examples=300, deadline=None)
@given(b=st.integers(1, 128), k=st.sampled_from((0, 1, 3)), p=st.integers(0, 2000),
       env=st.sampled_from((H200, GraphEnvelope("piecewise", capture_ceiling=256), GraphEnvelope("full", 64), CPU)),
       fits=st.sampled_from(("both", "piecewise only", "none>none")))
def test_step_extra_is_step_ms_over_the_decode_surface(b, k, p, env, fits):
    """``StepExtra`` (the controller's per-step price, no numpy) is ``StepCost.step_ms`` minus the
    decode step for every step, envelope and set of fits, an unmeasured transition included (0)."""
    chosen = {"both": {"full>piecewise": _fit("full>piecewise", 1.5, 0.002, 0.01),
                       "full>none": _fit("full>none", 20.0, -0.01, 0.03)},
              "piecewise only": {"piecewise>piecewise": _fit("piecewise>piecewise", 0.5, 0.0, 0.02)},
              "none>none": {"none>none": _fit("none>none", 0.2, 0.001, 0.05)}}[fits]
    ks = (0, 1, 3)
    cost = StepCost(ks=ks, decode_ms=_surface(n=128, ks=ks), envelope=env, fits=chosen)
    want = float(cost.step_ms(b, k, p)) - float(cost.decode_ms[ks.index(k), b - 1])
    assert cost.step_extra().ms(b * (1 + k), p) == pytest.approx(want, abs=1e-9)


def test_step_extra_worked_numbers_at_the_ceiling():
    cost = StepCost(ks=(3,), decode_ms=np.full((1, 128), 10.0), envelope=H200,
                    fits={"full>piecewise": _fit("full>piecewise", 1.0, 0.0, 0.01),
                          "full>none": _fit("full>none", 20.0, 0.0, 0.01)})
    x = cost.step_extra()
    assert x.ceiling == 512
    assert x.ms(512, 0) == 0.0  # a pure decode step
    assert x.ms(256, 32) == pytest.approx(1.32)  # 288 tokens: under the ceiling, piecewise
    assert x.ms(512, 32) == pytest.approx(20.32)  # 544 tokens: off the graphs
    assert x.ms(600, 1) == pytest.approx(20.01)  # the decode step itself above the ceiling
