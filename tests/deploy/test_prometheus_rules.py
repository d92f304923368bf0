"""deploy/prometheus/: ``promtool check rules`` and ``promtool test rules`` (Debian's ``prometheus``
package) on the committed rules; the unit tests fire every alert the rules define. The rules on a
real scrape: tests/controller/test_engine_metrics.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "tabletune-rules.yml"
TESTS = DEPLOY / "tabletune-rules.test.yml"


def promtool() -> str:
    exe = shutil.which("promtool")
    assert exe, "promtool is not installed: apt-get install -y prometheus (Debian)"
    return exe


def test_promtool_checks_the_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass_and_fire_every_alert():
    out = subprocess.run([promtool(), "test", "rules", TESTS.name], cwd=DEPLOY, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fired = {t["alertname"] for case in yaml.safe_load(TESTS.read_text())["tests"]
             for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert alerts and alerts == fired, (alerts, fired)


def test_a_broken_unit_test_fails(tmp_path):
    """promtool really evaluates: an expectation the rules do not meet fails."""
    broken = yaml.safe_load(TESTS.read_text())
    case = broken["tests"][0]
    case["alert_rule_test"][0]["exp_alerts"] = case["alert_rule_test"][1]["exp_alerts"]  # expects a fire at 8 min
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "broken.test.yml").write_text(yaml.safe_dump(broken))
    out = subprocess.run([promtool(), "test", "rules", "broken.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr
