"""The CPU build's synthetic rejection path (torch) and its runtime rates channel."""

from __future__ import annotations

import pytest

from tabletune_pipelines.formats.control_protocol import SYNTHETIC_CONTROL_ENV, ControlWriter

torch = pytest.importorskip("torch")

from tabletune_pipelines.engine import cpu_plugin  # noqa: E402
from tabletune_pipelines.engine.cpu_plugin import conditional_rates, synthetic_rejection  # noqa: E402


def _batch(B=64, S=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.arange(1, B + 1, dtype=torch.int32) * S
    draft = torch.randint(3, 2000, (B * S,), generator=g, dtype=torch.int32)
    target = torch.randint(3, 2000, (B * S,), generator=g)
    bonus = torch.randint(3, 2000, (B, 1), generator=g)
    u = torch.rand(B * S, generator=g, dtype=torch.float64)
    out = torch.full((B, S + 1), -1, dtype=torch.int32)
    return out, cu, draft, target, bonus, u


def test_zero_rates_reject_everything():
    out, cu, draft, target, bonus, u = _batch()
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, torch.zeros(3))
    assert torch.equal(out[:, 0].long(), target.view(-1, 3)[:, 0])
    assert (out[:, 1:] == -1).all()


def test_one_rates_accept_everything_with_bonus():
    out, cu, draft, target, bonus, u = _batch()
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, torch.ones(3))
    assert torch.equal(out[:, :3], draft.view(-1, 3))
    assert torch.equal(out[:, 3].long(), bonus.view(-1))


def test_rates_statistics_and_row_mask():
    B = 20000
    out, cu, draft, target, bonus, u = _batch(B=B, seed=3)
    cond = torch.tensor(conditional_rates([0.7, 0.5, 0.3]), dtype=torch.float32)
    synthetic_rejection(out, cu, draft, target, bonus, None, 3, u, cond)
    kept = (out[:, :3] == draft.view(-1, 3)).int().cumprod(1).sum(1)
    for i, want in enumerate((0.7, 0.5, 0.3), start=1):
        assert abs((kept >= i).float().mean().item() - want) < 0.02  # ~6 standard errors at B = 20000
    # Rows outside the mask are untouched; zero-draft rows get the bonus token.
    out2 = torch.full((2, 4), -1, dtype=torch.int32)
    synthetic_rejection(out2, torch.tensor([0, 0]), torch.tensor([], dtype=torch.int32),
                        torch.tensor([], dtype=torch.long), torch.tensor([[7], [8]]), torch.tensor([True, False]),
                        3, torch.rand(0, dtype=torch.float64), torch.zeros(3))
    assert out2.tolist() == [[7, -1, -1, -1], [-1, -1, -1, -1]]


def test_conditional_rates():
    assert conditional_rates([0.8, 0.4, 0.0]) == [0.8, 0.5, 0.0]
    assert conditional_rates([0.0, 0.0]) == [0.0, 0.0]


def test_runtime_rates_follow_the_channel(tmp_path, monkeypatch):
    path = tmp_path / "rates.json"
    monkeypatch.setenv(SYNTHETIC_CONTROL_ENV, str(path))
    monkeypatch.setattr(cpu_plugin, "_state", {"channel": None, "rates": None})
    launch = torch.tensor([0.7, 0.5 / 0.7, 0.3 / 0.5])
    assert cpu_plugin._runtime_rates(launch) is launch  # nothing sent yet: the launch's rates
    w = ControlWriter(path)
    seq = w.send({"rates": [1.0, 1.0, 1.0]})
    assert cpu_plugin._runtime_rates(launch).tolist() == [1.0, 1.0, 1.0]
    assert w.wait_ack(seq, timeout=1.0)["rates"] == [1.0, 1.0, 1.0]
    seq = w.send({"rates": "all"})
    assert cpu_plugin._runtime_rates(launch).tolist() == [1.0, 1.0, 1.0]  # a bad command keeps the rates
    assert "error" in w.read_ack() and w.read_ack()["ack"] == seq


def test_register_is_a_noop_off_the_cpu_build(monkeypatch):
    monkeypatch.setattr(cpu_plugin, "is_cpu_build", lambda: False)
    cpu_plugin.register()  # nothing to patch, must not raise

    def boom():
        raise RuntimeError("broken vllm")

    monkeypatch.setattr(cpu_plugin, "is_cpu_build", boom)
    cpu_plugin.register()  # errors are logged, never raised
