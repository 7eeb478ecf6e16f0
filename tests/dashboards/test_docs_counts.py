"""Numbers the docs state about the rules are the rules' own: a count written once drifts (the docs said
"twenty-one" alert rules while 24 loaded)."""

import re
from pathlib import Path

from npudist.dashboards.rules import ALERTS

DOCS = [*Path(__file__).resolve().parents[2].joinpath("docs").rglob("*.md"),
        Path(__file__).resolve().parents[2] / "README.md"]
WORDS = r"one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty"


def test_every_count_of_alert_rules_in_the_docs_is_the_number_that_loads():
    stated = [(p.name, m.group(1)) for p in DOCS
              for m in re.finditer(rf"\b(\d+|(?:{WORDS})(?:-\w+)?) alert rules\b", p.read_text(), re.I)]
    assert stated, "the docs no longer state the count; drop this test with it"
    assert all(n == str(len(ALERTS)) for _, n in stated), (stated, len(ALERTS))
