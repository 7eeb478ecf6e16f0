"""promtool check rules and promtool test rules (scenarios in tests/promtool/*.yml) on the generated rules."""

import shutil
import subprocess

import pytest

from npudist.dashboards import rules_document
from npudist.dashboards.rules import to_yaml
from tests.conftest import REPO

PROMTOOL = shutil.which("promtool")
pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) not installed")]
SCENARIOS = sorted((REPO / "tests" / "promtool").glob("*.yml"))


@pytest.fixture
def rules_dir(tmp_path):
    (tmp_path / "rules.yml").write_text(to_yaml(rules_document()))
    for s in SCENARIOS:
        shutil.copy(s, tmp_path / s.name)
    return tmp_path


def test_rules_pass_promtool_check_and_lint(rules_dir):
    res = subprocess.run([PROMTOOL, "check", "rules", str(rules_dir / "rules.yml")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_alert_scenarios(rules_dir, scenario):
    res = subprocess.run([PROMTOOL, "test", "rules", scenario], cwd=rules_dir, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
