"""A profiler killed with SIGTERM (``timeout``, a job scheduler) stops the engines it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time


def _default_termination_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def test_sigterm_runs_the_server_cleanup(tmp_path):
    marker = tmp_path / "stopped"
    script = textwrap.dedent(f"""
        import time
        from tabletune_pipelines.engine import process

        class FakeServer:  # stands in for a started VLLMServer: only stop() matters here
            def stop(self):
                open({str(marker)!r}, "w").write("ok")

        srv = FakeServer()
        process._LIVE.add(srv)
        assert process.install_termination_handler()
        print("ready", flush=True)
        time.sleep(60)
    """)
    # The child starts with SIGTERM and SIGHUP at their defaults whatever this runner inherited (a
    # runner started under nohup, or by a supervisor that ignores SIGTERM, passes SIG_IGN down, and an
    # ignored signal is one the handler deliberately leaves alone: the next test).
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            preexec_fn=_default_termination_signals)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 128 + signal.SIGTERM
    assert marker.read_text() == "ok"


def test_a_handler_someone_else_installed_is_kept():
    script = textwrap.dedent("""
        import signal
        from tabletune_pipelines.engine import process
        mine = lambda s, f: None
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, mine)
        assert not process.install_termination_handler()
        assert signal.getsignal(signal.SIGTERM) is mine
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_an_ignored_sigterm_is_left_ignored():
    """A process started with SIGTERM and SIGHUP ignored (nohup, a supervisor) keeps them ignored."""
    script = textwrap.dedent("""
        import signal
        from tabletune_pipelines.engine import process
        assert not process.install_termination_handler()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    """)

    def ignore() -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, preexec_fn=ignore)
