"""Hostile run logs: whatever a rank file holds, `npudist report` renders a page, names the bad lines, and
puts no NaN/inf into a chart or table."""

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npudist.report import load_run, report_html
from npudist.report.model import Series
from npudist.report.svg import line_chart
from npudist.telemetry import runlog_schema as schema
from tests.report.runs import write_run

_COORD = re.compile(r'\b(?:x|y|x1|x2|y1|y2|cx|cy)="([^"]*)"|points="([^"]*)"')


def assert_clean_svg(markup: str) -> None:
    """Every coordinate is a finite number inside the picture."""
    for svg in re.findall(r"<svg.*?</svg>", markup, re.S):
        width, height = (float(v) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
        for single, many in _COORD.findall(svg):
            for value in (single.split() if single else many.replace(",", " ").split()):
                v = float(value)
                assert math.isfinite(v) and -1 <= v <= max(width, height) + 1, (value, svg[:200])


def _page_without_problems(page: str) -> str:
    return page.split('<section id="problems">')[0]


def _run(tmp_path, lines: list[str]):
    root = write_run(tmp_path / "run")
    with (root / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    page, data = report_html(root)
    assert_clean_svg(page)
    assert not re.search(r"\b(?:nan|inf|infinity)\b", _page_without_problems(page), re.I)
    return page, data


def _raw_step(field: str, digits: str) -> str:
    """A step line with ``digits`` written as the number of ``field`` (json.dumps cannot write these)."""
    values = {"v": "1", "time": "3000", "kind": '"step"', "step": "32", "loss": "1", field: digits}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in values.items()) + "}"


def _step(step, loss, **extra) -> str:
    return json.dumps({"v": 1, "time": 3000.0, "kind": "step", "step": step, "loss": loss, **extra})


BIG = "9" * 400  # a 400-digit integer: int() reads it, float() overflows
HUGE = "9" * 5000  # past Python's int-string limit (4300 digits): json.loads itself refuses it

HOSTILE = {
    "loss 1e308 (finite, kept)": ([_step(30, 1e308), _step(31, -1e308)], 0),
    "400-digit loss": ([_raw_step("loss", BIG)], 1),
    "400-digit step": ([_raw_step("step", BIG)], 1),
    "400-digit time": ([_raw_step("time", BIG)], 1),
    "5000-digit integer": ([_raw_step("loss", HUGE)], 1),
    "1e400 (inf as float)": ([_raw_step("loss", "1e400")], 1),
    "NaN and Infinity": (['{"v": 1, "time": 3000, "kind": "step", "step": 36, "loss": NaN}',
                         '{"v": 1, "time": 3000, "kind": "step", "step": 37, "loss": -Infinity}'], 2),
    "deep nesting": (["[" * 100_000 + "]" * 100_000, '{"v": 1, "kind": "step", "x": ' + "[" * 50_000 + "]" * 50_000
                     + "}"], 2),
    "nested value in a number field": ([_step(38, [[[[1.0]]]])], 1),
    "huge comm totals": ([json.dumps({"v": 1, "time": 3000.0, "kind": "comm", "wall_seconds": 1e-300, "ops": [
        {"op": "all_reduce", "backend": "gloo", "calls": 2**63 - 1, "bytes": 2**63 - 1, "seconds": 1e308},
        {"op": "all_reduce", "backend": "gloo", "calls": 1, "bytes": 1, "seconds": 1e308}]})], 0),
    "count past int64": ([json.dumps({"v": 1, "time": 3000.0, "kind": "comm", "wall_seconds": 1.0, "ops": [
        {"op": "x", "backend": "gloo", "calls": 2**64, "bytes": 1, "seconds": 1.0}]})], 1),
    "device values at float64's edges": ([json.dumps({"v": 1, "time": -1e308, "kind": "device",
                                                     "power_watts": 1.7e308, "temperature_celsius": 5e-324}),
                                         json.dumps({"v": 1, "time": 1e308, "kind": "device", "power_watts": -1.7e308,
                                                     "temperature_celsius": -5e-324})], 0),
    "steps beyond float precision": ([_step(2**60, 1.0), _step(2**60 + 1, 1.0 + 2**-52)], 0),
    "huge text": ([json.dumps({"v": 1, "time": 3000.0, "kind": "start", "world": 2, "start_step": 0,
                              "node": "n" * 100_000})], 1),
    "bool where a count belongs": ([json.dumps({"v": 1, "time": 3000.0, "kind": "step", "step": True})], 1),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_lines_never_stop_the_report(tmp_path, name):
    lines, bad = HOSTILE[name]
    page, data = _run(tmp_path, lines)
    mine = [p for p in data.problems if p.line is not None and p.line > 10]  # the base run has 10 good lines
    assert len(mine) == bad, [p.reason for p in mine]
    assert f'data-count="{len(data.problems)}"' in page if data.problems else "None: every line" in page


def test_the_reasons_name_what_was_wrong(tmp_path):
    _, data = _run(tmp_path, [HOSTILE["400-digit loss"][0][0], HOSTILE["5000-digit integer"][0][0],
                              HOSTILE["deep nesting"][0][0], HOSTILE["NaN and Infinity"][0][0]])
    reasons = [p.reason for p in data.problems]
    assert reasons[0] == "field 'loss' is a number too large for float64"
    assert reasons[1].startswith("not JSON") and "4300" in reasons[1]
    assert reasons[2].endswith("nested too deeply")
    assert "NaN is not a JSON number" in reasons[3]


def test_a_newer_log_says_to_upgrade(tmp_path):
    newer = [json.dumps({"v": 3, "time": 3000.0, "kind": "step", "step": 40, "loss": 1.0, "new": {"x": 1}}),
             json.dumps({"v": 2, "time": 3000.0, "kind": "telepathy"})]
    _, data = _run(tmp_path, newer)
    (problem,) = [p for p in data.problems if p.line is not None and p.line > 10]
    assert problem.line == 11
    assert problem.reason == ("2 line(s) skipped: run log version 3 is newer than this npudist reads (1): "
                              "upgrade npudist (pip install -U npudist) to report it")


def test_an_over_long_line_is_skipped_and_the_next_one_read(tmp_path):
    from npudist.report import records

    root = write_run(tmp_path / "run")
    with (root / "metrics" / "rank1.jsonl").open("a") as fh:
        fh.write('{"pad": "' + "x" * (records.MAX_LINE + 10) + '"}\n' + _step(99, 0.5) + "\n")
    _, data = report_html(root)
    assert [p.reason for p in data.problems] == [f"line longer than {records.MAX_LINE} characters"]
    assert (99.0, 0.5) in data.loss[1].points


_JSON_ATOMS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_JSON = st.recursive(_JSON_ATOMS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)


def _record(kind: str, values: dict) -> dict:
    fields = [f.name for f in schema.KINDS[kind].fields]
    return {"v": 1, "time": values.pop("time", 1.0), "kind": kind,
            **{name: values.get(name, 0) for name in fields}, **values}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(st.sampled_from(list(schema.KINDS)),
                                  st.dictionaries(st.sampled_from(["time", "step", "loss", "step_seconds", "skew",
                                                                   "means", "straggler", "first_step", "last_step",
                                                                   "flagged", "ratios", "wall_seconds", "ops",
                                                                   "power_watts", "world", "node", "v"]),
                                                  _JSON, max_size=5)),
                        min_size=1, max_size=8))
def test_any_record_values_render(tmp_path_factory, records):
    tmp_path = tmp_path_factory.mktemp("h")
    lines = [json.dumps(_record(kind, dict(values))) for kind, values in records]
    _run(tmp_path, lines)
    run = load_run(tmp_path / "run")
    used = sum(1 for r in run.records if r["rank"] == 0) - 10  # the base run's rank 0 has 10 good lines
    named = [p for p in run.problems if p.line is not None and p.line > 10]
    assert used + len(named) == len(lines)  # every line is either used or named once


@settings(max_examples=150, deadline=None)
@given(points=st.lists(st.tuples(st.floats(allow_nan=False, allow_infinity=False),
                                 st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=6),
       log2_x=st.booleans(), from_zero=st.booleans())
def test_any_finite_points_make_a_clean_chart(points, log2_x, from_zero):
    if log2_x and not any(x > 0 for x, _ in points):
        return
    svg = line_chart([Series("s", tuple(sorted(points)))], title="t", x_label="x", y_label="y", log2_x=log2_x,
                     y_from_zero=from_zero)
    assert_clean_svg(svg)
    assert "nan" not in svg.lower() and "inf" not in svg.lower()


@pytest.mark.parametrize("mtime", [1e20, -1e20, float("nan")])
def test_a_checkpoint_time_no_calendar_holds_is_shown_as_such(tmp_path, monkeypatch, mtime):
    """Third audit: an mtime outside gmtime's range (set on a filesystem with 64-bit times, or a FUSE mount
    that reports garbage) crashed the report. Filesystems here clamp utime, so the stat is injected."""
    import dataclasses

    from npudist.report import records

    root = write_run(tmp_path / "run")
    (root / "step-00000010").mkdir()
    (root / "step-00000010" / "model.pt").write_bytes(b"x" * 10)
    real = records.run_files
    monkeypatch.setattr(records, "run_files", lambda r: tuple(
        [dataclasses.replace(f, mtime=mtime) for f in files] for files in real(r)))
    page, data = report_html(root)
    assert [f.step for f in data.checkpoints] == [10]
    assert "step-00000010" in page and "not recorded (record time out of range)" in page
