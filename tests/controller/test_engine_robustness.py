"""The controller never hurts serving, on real vLLM (CPU build), and the log says what happened.

ONE server, started with ``--scheduler-cls ...AsyncControllerScheduler`` (vLLM's async-scheduling
base class, on the CPU build's sync engine) while the published file does not exist yet, and with
faults injected into the controller from outside the product code: a ``sitecustomize`` on the
engine's PYTHONPATH wraps ``Controller.on_step`` / ``Controller.next_lookup`` so that every 97th
step raises, every 101st lookup raises, and every 13th step reports each request as having kept 4
more tokens than it drafted. The launch table leaves out k = 2. While 8 clients keep sending, the
file is replaced in turn by: a truncated file, another schema version, a file made for another
engine, a table using k = 2, a valid file exporting into a folder that cannot exist, a valid file.
Every request must complete, and the log must hold one line per distinct problem.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

from tabletune_pipelines.engine import VLLMServer
from tabletune_pipelines.engine.command import PACKAGE_ROOT
from tabletune_pipelines.evaluation.rig import Rig, closed_loop, identity, server_config
from tabletune_pipelines.evaluation.synthetic import publish
from tests.conftest import VLLM_CACHE_ENV

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

LAUNCH = ((1, 1, 0), (2, 2, 1), (3, 16, 3))
FAULTS = textwrap.dedent('''
    import dataclasses
    import os
    if os.environ.get("TT_INJECT_FAULTS"):
        try:
            from tabletune_pipelines.controller import logic as _logic
            _on_step, _next_lookup, _n = _logic.Controller.on_step, _logic.Controller.next_lookup, [0, 0]

            def on_step(self, step, *args, **kw):
                _n[0] += 1
                if _n[0] % 97 == 0:
                    raise RuntimeError("injected fault in on_step")
                if _n[0] % 13 == 0 and step.sampled:
                    # a copy: vLLM's own lists stay as they are
                    step = dataclasses.replace(step, sampled=[list(s) + [0] * 4 for s in step.sampled])
                return _on_step(self, step, *args, **kw)

            def next_lookup(self, *args, **kw):
                _n[1] += 1
                if _n[1] % 101 == 0:
                    raise RuntimeError("injected fault in next_lookup")
                return _next_lookup(self, *args, **kw)

            _logic.Controller.on_step, _logic.Controller.next_lookup = on_step, next_lookup
        except Exception:
            pass
''')


def replace(path, text):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_engine_keeps_serving_through_bad_files_faults_and_a_dead_export(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAULTS)
    pub = tmp_path / "local.json"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # the fault injector first, then this checkout's package (extra_env replaces the PYTHONPATH the
    # launcher would have extended with it, and the engine would import the installed copy instead)
    env = {"PYTHONPATH": os.pathsep.join([str(site), PACKAGE_ROOT]), "TT_INJECT_FAULTS": "1", **VLLM_CACHE_ENV}
    srv = VLLMServer(server_config(tmp_path, pub, launch=LAUNCH, rates=(0.5, 0.3, 0.1),
                                   cls="AsyncControllerScheduler", extra_env=env))
    rig = Rig(srv, pub, tmp_path / "local.live.jsonl")
    ident = identity()
    good = dict(ranges=[(1, 8, 3), (9, 16, 1)], rates=(0.5, 0.3, 0.1), identity=ident, allowed_k=[0, 1, 3])
    srv.start()
    load = closed_loop(srv, 8).start()
    try:
        steps = []

        def settle():
            # One poll interval (1 s), then progress rather than seconds: every phase must complete
            # requests (a stalled engine fails wait_completed), however fast the machine is.
            time.sleep(1.2)
            steps.append(load.wait_completed(3, timeout=120.0))

        settle()
        publish(pub, **good)
        text = pub.read_text()
        replace(pub, text[: len(text) // 2])  # truncated
        settle()
        doc = json.loads(text)
        replace(pub, json.dumps({**doc, "schema_version": 2}))
        settle()
        publish(pub, over_junk=True, **{**good, "identity": {**ident, "model": "/elsewhere/model"}})
        settle()
        publish(pub, **{**good, "ranges": [(1, 8, 2), (9, 16, 1)], "allowed_k": [1, 2]})
        settle()
        publish(pub, version=1, controller={"export_path": str(blocker / "live.jsonl"), "export_every_s": 1.0}, **good)
        settle()
        settle()
        publish(pub, version=2, controller={"export_every_steps": 100, "export_every_s": 1.0}, **good)
        hit, mine = rig.wait(lambda w: w.controller["steps"] > 0 and w.controller["errors"] > 0
                             and w.controller["anomalies"] > 0, version=2, max_steps=3000)
        settle()
    finally:
        load.stop()
        log = rig.log()
        srv.stop()
    print(f"\n[robustness] requests sent {load.sent}, completed {load.completed}; completed after each phase {steps}")
    assert load.errors == [] and load.completed == load.sent and load.completed > 50
    assert all(b > a for a, b in zip(steps, steps[1:])), steps  # serving went on through every phase
    assert hit is not None
    state = mine[-1].controller
    print(f"[robustness] final state: errors {state['errors']}, anomalies {state['anomalies']}, export failures "
          f"{state['export_failures']}, reloads {state['reloads']}, table {state['table']}")
    assert state["mode"] == "control" and state["export_failures"] >= 1 and state["reloads"] == 2  # v1 and v2, both while serving

    def once(fragment):
        n = sum(fragment in line for line in log.splitlines())
        assert n == 1, f"{fragment!r} logged {n} times"

    once("using the engine's configured table [[1,1,0],[2,2,1],[3,16,3]]: published table")
    once("does not exist; publish one with the pipeline first")
    once("is not valid JSON")
    once("schema_version 2; this reader understands 1")
    once("was made for another engine: model '/elsewhere/model'")
    once("uses k = [2], which the launch table")
    once("cannot write live counters to")
    once("counting a step failed (RuntimeError('injected fault in on_step'))")
    once("choosing the next lookup failed (RuntimeError('injected fault in next_lookup'))")
    once("kept > drafted")
    once("published v1 of test loaded")
    once("published v2 of test loaded")
    # no PROMETHEUS_MULTIPROC_DIR on this launch: one line says the series do not reach /metrics
    once("its Prometheus series stay in the engine core process, which vLLM's /metrics does not read")
    # The only tracebacks are the two injected faults' (each logged once); the bad files raised nothing.
    assert log.count("Traceback") == 2 and log.count("RuntimeError: injected fault") == 2
