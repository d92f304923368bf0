"""The GPU's runtime switch of synthetic rates (engine.gpu_synthetic), on a stand-in sampler class:
the wrap, the in-place copy, the acknowledgement and the refusals. The real sampler runs on the GPU
machine (benchmarks/gpu_flow.py --one-launch); vLLM's CPU build has no such sampler to wrap."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tabletune_pipelines.engine import gpu_synthetic
from tabletune_pipelines.formats.control_protocol import SYNTHETIC_CONTROL_ENV, ControlReader, ControlWriter


class Sampler:
    """Has what vLLM's RejectionSampler has: the conditional rates tensor and an entry point."""

    def __init__(self, rates):
        self.synthetic_conditional_rates = None if rates is None else torch.tensor(rates, dtype=torch.float32)
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return None if self.synthetic_conditional_rates is None else self.synthetic_conditional_rates.tolist()


def test_apply_pending_copies_in_place_and_acknowledges(tmp_path):
    path = tmp_path / "rates.json"
    reader, writer = ControlReader(str(path)), ControlWriter(path)
    s = Sampler([0.0, 0.0, 0.0])
    before = s.synthetic_conditional_rates.data_ptr()
    assert gpu_synthetic.apply_pending(s, reader) is None  # nothing sent
    seq = writer.send({"rates": [0.8, 0.4, 0.2]})
    assert gpu_synthetic.apply_pending(s, reader) == [0.8, 0.4, 0.2]
    assert s.synthetic_conditional_rates.tolist() == pytest.approx([0.8, 0.5, 0.5])  # conditional
    assert s.synthetic_conditional_rates.data_ptr() == before  # same tensor: in place
    assert writer.wait_ack(seq, timeout=1.0)["rates"] == [0.8, 0.4, 0.2]
    seq = writer.send({"rates": [0.5, 0.9, 0.1]})  # increasing: refused, the rates in force stay
    assert gpu_synthetic.apply_pending(s, reader) is None
    assert writer.read_ack()["ack"] == seq and "rates[2] = 0.9" in writer.read_ack()["error"]
    assert s.synthetic_conditional_rates.tolist() == pytest.approx([0.8, 0.5, 0.5])


def test_a_sampler_that_is_not_synthetic_refuses(tmp_path):
    path = tmp_path / "rates.json"
    reader, writer = ControlReader(str(path)), ControlWriter(path)
    seq = writer.send({"rates": [0.5, 0.5]})
    assert gpu_synthetic.apply_pending(Sampler(None), reader) is None
    assert writer.read_ack()["ack"] == seq and "not synthetic" in writer.read_ack()["error"]


def test_install_wraps_once_and_the_wrapped_call_applies_the_command(tmp_path, monkeypatch):
    path = tmp_path / "rates.json"
    mod = types.ModuleType("fake_vllm_sampler")
    mod.RejectionSampler = type("RejectionSampler", (Sampler,), {})
    monkeypatch.setitem(sys.modules, "fake_vllm_sampler", mod)
    monkeypatch.setattr(gpu_synthetic, "SAMPLERS", (("fake_vllm_sampler", "RejectionSampler", "__call__"),
                                                    ("no_such_module_here", "RejectionSampler", "forward")))
    monkeypatch.setattr(gpu_synthetic, "_state", {"channel": None})
    monkeypatch.delenv(SYNTHETIC_CONTROL_ENV, raising=False)
    assert gpu_synthetic.install() == []  # no channel: nothing wrapped
    monkeypatch.setenv(SYNTHETIC_CONTROL_ENV, str(path))
    assert gpu_synthetic.install() == ["fake_vllm_sampler.RejectionSampler.__call__"]
    gpu_synthetic.install()  # a second install does not wrap the wrap
    assert getattr(mod.RejectionSampler.__call__.__wrapped__, "__wrapped__", None) is None
    s = mod.RejectionSampler([0.0, 0.0])
    writer = ControlWriter(path)
    seq = writer.send({"rates": [1.0, 1.0]})
    assert s() == [1.0, 1.0]  # applied before the verification it precedes
    assert writer.wait_ack(seq, timeout=1.0)["rates"] == [1.0, 1.0] and s.calls == 1
