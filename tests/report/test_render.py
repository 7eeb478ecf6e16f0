import json
import re
from decimal import Decimal

import pytest

from npudist.report import build, load_run, render, report_html
from npudist.report.model import Series
from npudist.report.svg import line_chart, nice_ticks, size_label
from tests.report.runs import write_run


def test_ticks_cover_the_data_with_round_steps():
    def floats(lo, hi):
        return [float(t) for t in nice_ticks(lo, hi)]

    assert floats(1.07, 4.32) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert floats(0.0, 0.105) == [0.0, 0.05, 0.1, 0.15]
    assert floats(20, 40) == [20, 25, 30, 35, 40]
    # decimal arithmetic: a range float64 cannot subtract, and one narrower than its smallest step
    assert nice_ticks(-1.7e308, 1.7e308)[-1] == Decimal("2e308")  # float64 would make it inf
    assert len(nice_ticks(0.0, 5e-324)) >= 2 and len(nice_ticks(2.0**60, 2.0**60 + 256)) >= 2
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0, float("inf"))


def test_sizes_are_labelled_like_nccl_tests():
    assert [size_label(n) for n in (1024, 65536, 67108864, 2**30, 1000)] == ["1K", "64K", "64M", "1G", "1000"]


def test_points_land_where_the_axes_say():
    # default 720x320 with margins 70/20/20/50: the plot is x 70..700, y 20..270
    svg = line_chart([Series("a", ((0.0, 0.0), (10.0, 5.0)))], title="t", x_label="x", y_label="y")
    (points,) = re.findall(r'points="([^"]+)"', svg)
    assert points == "70.0,270.0 700.0,20.0"


def test_log2_axis_puts_each_doubling_one_step_further():
    svg = line_chart([Series("bw", ((1024.0, 1.0), (2048.0, 1.0), (4096.0, 1.0)))], title="t", x_label="x",
                     y_label="y", log2_x=True, y_from_zero=True)
    (points,) = re.findall(r'points="([^"]+)"', svg)
    assert [p.split(",")[0] for p in points.split()] == ["70.0", "385.0", "700.0"]
    assert ">1K<" in svg and ">2K<" in svg and ">4K<" in svg


def test_log_axis_puts_each_power_of_ten_one_step_further():
    svg = line_chart([Series("loss", ((0.0, 1.0), (1.0, 10.0), (2.0, 100.0)))], title="t", x_label="x",
                     y_label="y", log_y=True)
    (points,) = re.findall(r'points="([^"]+)"', svg)
    assert [p.split(",")[1] for p in points.split()] == ["270.0", "145.0", "20.0"]  # plot y runs 270 -> 20
    labels = re.findall(r'text-anchor="end" font-size="11">([^<]+)</text>', svg)
    assert labels[0] == "1" and labels[-1] == "100" and "10" in labels and "50" in labels
    # a loss between 1.19 and 4.33 (the example's) gets the 1-2-5 ticks around it
    svg = line_chart([Series("loss", ((0.0, 4.33), (1.0, 1.19)))], title="t", x_label="x", y_label="y", log_y=True)
    assert re.findall(r'text-anchor="end" font-size="11">([^<]+)</text>', svg) == ["1", "2", "5"]


@pytest.mark.parametrize("kw", [{}, {"y_from_zero": True}, {"y_max": 1.0}])
def test_a_log_axis_is_refused_for_values_it_cannot_place(kw):
    values = ((0.0, 0.5), (1.0, 0.0 if not kw else 0.2))
    with pytest.raises(ValueError, match="log y axis"):
        line_chart([Series("a", values)], title="t", x_label="x", y_label="y", log_y=True, **kw)


def test_smoothing_is_tensorboards_debiased_moving_average_restarted_at_a_resume():
    from npudist.report.model import smoothed

    # by hand, weight 0.6: m1 = 0.4*1 = 0.4, debiased /0.4 = 1; m2 = 0.6*0.4 + 0.4*3 = 1.44, /0.64 = 2.25
    got = smoothed(Series("r0", ((1.0, 1.0), (2.0, 3.0), (3.0, 5.0), (4.0, 7.0)), breaks=(3.0,)))
    assert [round(y, 9) for _, y in got.points] == [1.0, 2.25, 5.0, 6.25] and got.breaks == (3.0,)
    flat = smoothed(Series("r1", tuple((float(i), 2.5) for i in range(50))))
    assert all(abs(y - 2.5) < 1e-12 for _, y in flat.points)
    with pytest.raises(ValueError, match="weight"):
        smoothed(flat, 1.0)


def test_loss_toggles_offer_no_log_scale_for_a_loss_at_or_below_zero():
    from npudist.report.model import ReportData
    from npudist.report.render import _loss

    fields = {f: () for f in ReportData.__dataclass_fields__}
    data = ReportData(**{**fields, "loss": (Series("rank 0", ((1.0, 0.5), (2.0, -0.1))),)})
    html = _loss(data)
    assert re.findall(r'data-plot="([^"]+)"', html) == ["loss", "loss-smooth"]
    assert 'id="loss-log" disabled' in html and "at or below zero" in html


def test_chart_without_points_is_refused():
    with pytest.raises(ValueError, match="no points"):
        line_chart([Series("a", ())], title="empty", x_label="x", y_label="y")


def test_page_has_every_plot_and_no_script(tmp_path):
    page, _ = report_html(write_run(tmp_path))
    plots = re.findall(r'data-plot="([^"]+)"', page)
    assert plots == ["loss", "loss-log", "loss-smooth", "loss-smooth-log", "step-time", "work-time",
                     "skew", "busbw", "utilization_ratio", "power_watts",
                     "memory_used_bytes"]
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "25.0 %" in page  # the collective time share, 4 s of 16 s
    assert 'data-missing="temperature_celsius"' in page


def test_missing_parts_say_not_recorded(tmp_path):
    page = render(build(load_run(tmp_path)), str(tmp_path))
    missing = re.findall(r'data-missing="([^"]+)"', page)
    assert missing == ["loss", "step_time", "work_time", "phases", "skew", "comm", "bench", "device"]
    assert "<svg" not in page


def test_problems_are_shown_and_text_is_escaped(tmp_path):
    run_dir = write_run(tmp_path / "<b>run</b>", bad_lines=True)
    page, data = report_html(run_dir)
    assert len(data.problems) == 2
    assert 'class="problems" data-count="2"' in page
    assert "<b>run</b>" not in page and "&lt;b&gt;run&lt;/b&gt;" in page


def test_axis_labels_read_as_people_write_numbers():
    from npudist.report.svg import number_label

    def labels(lo, hi):
        ticks = nice_ticks(lo, hi)
        return [number_label(t, ticks[1] - ticks[0]) for t in ticks]

    assert labels(0, 100) == ["0", "20", "40", "60", "80", "100"]
    assert labels(0, 6000) == ["0", "2k", "4k", "6k"]
    assert labels(0, 2.5e6) == ["0", "500k", "1M", "1.5M", "2M", "2.5M"]
    assert labels(0, 0.3) == ["0", "0.1", "0.2", "0.3"]


def test_threshold_line_and_ratio_bounds():
    from npudist.report.model import Series

    svg = line_chart([Series("s", ((1.0, 0.05), (2.0, 0.08)))], title="t", x_label="x", y_label="y",
                     threshold=0.12, y_max=1.0, y_from_zero=True)
    assert 'class="threshold"' in svg and "threshold 0.12" in svg
    ratio = line_chart([Series("u", ((1.0, 0.5), (2.0, 0.7)))], title="t", x_label="x", y_label="y",
                       y_from_zero=True, y_max=1.0)
    import re

    y_ticks = re.findall(r'text-anchor="end" font-size="11">([^<]+)</text>', ratio)
    assert y_ticks[0] == "0" and y_ticks[-1] == "1"  # a ratio axis ends at 1, not at the next round tick


def test_a_3x_straggler_stands_out_in_work_time_while_step_times_are_equal(tmp_path):
    """Every rank waits for the slowest in the all_reduce, so step times match; the work times (skew records'
    per-rank means) do not: rank 1 at 3x is the top line of its chart."""
    root = write_run(tmp_path)
    with (root / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write(json.dumps({"v": 1, "time": 2004.0, "kind": "skew", "first_step": 10, "last_step": 20,
                             "skew": 0.5, "straggler": 1, "means": [0.1, 0.3]}) + "\n")
    data = build(load_run(root))
    work = {s.name: s.points for s in data.work_time}
    assert work["rank 1"][-1] == (20.0, 0.3) and work["rank 0"][-1] == (20.0, 0.1)
    page = render(data, "run")
    figure = page.split('id="plot-work-time"', 1)[1].split("</figure>", 1)[0]
    lines = re.findall(r'points="([^"]+)"', figure)
    last_y = [float(p.split()[-1].split(",")[1]) for p in lines]
    assert last_y[1] < last_y[0]  # SVG y grows downwards: rank 1 is drawn above rank 0
    assert "the slowest rank has the smallest share" in page and "no alert uses it" in page


def test_a_flat_zero_ratio_line_gets_a_0_to_1_axis():
    svg = line_chart([Series("skew", ((1.0, 0.0), (2.0, 0.0)))], title="t", x_label="x", y_label="y",
                     y_from_zero=True, y_max=1.0)
    assert ">-1<" not in svg and ">1<" in svg and ">0<" in svg


def test_a_benchmark_reading_is_dated_by_its_file(tmp_path):
    import os

    root = write_run(tmp_path)
    os.utime(root / "bench" / "all_reduce.json", (1_700_000_000, 1_700_000_000))
    (series,) = build(load_run(root)).bench
    assert series.name.endswith("(bench/all_reduce.json, 2023-11-14 22:13:20 UTC)")


def test_a_line_is_not_drawn_across_the_pause_before_a_resumed_segment():
    from npudist.report.model import device_series

    records = [{"rank": 0, "time": t, "kind": k, **({"utilization_ratio": u} if k == "device" else {})}
               for t, k, u in ((1000.0, "start", 0), (1001.0, "device", 0.5), (1002.0, "device", 0.6),
                               (5000.0, "start", 0), (5001.0, "device", 0.7), (5002.0, "device", 0.8))]
    (series,) = device_series(records, 1000.0)["utilization_ratio"]
    assert series.breaks == (0.0, 4000.0)
    svg = line_chart([series], title="t", x_label="s", y_label="r")
    lines = re.findall(r'<polyline[^>]*points="([^"]+)"', svg)
    assert [len(p.split()) for p in lines] == [2, 2]  # two segments, no line over the 4000 s pause
    joined = line_chart([Series("r", series.points)], title="t", x_label="s", y_label="r")
    assert len(re.findall("<polyline", joined)) == 1


def test_the_skew_axis_fits_the_skews_instead_of_always_reaching_1(tmp_path):
    """Skews of a healthy run are a few hundredths: on a fixed 0-1 axis they were a flat line at the bottom."""
    root = write_run(tmp_path)
    with (root / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write(json.dumps({"v": 1, "time": 2004.0, "kind": "skew", "first_step": 10, "last_step": 20,
                             "skew": 0.05, "straggler": 1, "means": [0.1, 0.11]}) + "\n")
    page, _ = report_html(root)
    figure = page.split('id="plot-skew"', 1)[1].split("</figure>", 1)[0]
    ticks = [float(t) for t in re.findall(r'text-anchor="end" font-size="11">([^<]+)</text>', figure)]
    assert ticks[0] == 0 and 0.2 <= ticks[-1] < 0.5, ticks  # skews 0.2 and 0.05 (threshold line 0.12)
