"""The whole path: a real 2-rank training job and a bench run record into one run directory, `npudist
report` renders it, headless Chromium screenshots the page and shows it has its plots and no console errors."""

import re
import shutil
import subprocess

import pytest

from tests.conftest import run_npudist
from tests.report.runs import write_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--enable-logging=stderr", "--v=0"]


@pytest.mark.subprocess
def test_cli_names_a_missing_run_dir(tmp_path):
    proc = run_npudist(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "r.html")])
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert proc.returncode == 2
    assert "missing' does not exist" in message and "pass the --run-dir" in message
    assert not (tmp_path / "r.html").exists()


@pytest.mark.subprocess
def test_cli_writes_the_page_and_counts_skipped_lines(tmp_path):
    out = tmp_path / "out" / "report.html"
    proc = run_npudist(["report", str(write_run(tmp_path / "run", bad_lines=True)), "-o", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "2 unusable record(s) skipped" in " ".join(proc.stderr.split())
    page = out.read_text()
    # 8 plots: charts (the loss drawn 4 ways: raw or smoothed, linear or log), and one-sample series (the
    # fixture's single skew window, device readings) as values
    assert page.count("data-plot=") == 8 + 3 and page.count('class="single"') == 5  # work time: one window


@pytest.mark.subprocess
def test_a_run_dir_without_run_logs_still_gets_a_page_and_a_warning(tmp_path):
    (tmp_path / "run").mkdir()
    out = tmp_path / "report.html"
    proc = run_npudist(["report", str(tmp_path / "run"), "-o", str(out)])
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 0 and out.is_file()
    assert "holds no run log" in message and "--run-dir RUN_DIR" in message


def _chromium(args: list[str], tmp_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args], text=True,
                          capture_output=True, timeout=90, check=False)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)  # a training, a resume, a benchmark and two browser runs on a shared machine
@pytest.mark.skipif(CHROMIUM is None, reason="headless check needs Debian's chromium (apt-get install chromium)")
def test_training_run_report_renders_in_chromium(tmp_path, golden_run):
    run_dir = tmp_path / "run"
    # the shared 100-step run (one skew exchange), copied and resumed to 105: it appends to the same logs
    shutil.copytree(golden_run.run_dir, run_dir)
    proc = run_npudist(["launch", "--nproc-per-node", "2", *golden_run.args_for(run_dir), "--steps", "105"],
                       timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_npudist(["bench", "collective", "--nproc", "2", "--min-bytes", "1K", "--max-bytes", "8K", "--blocks",
                        "1", "--iters", "2", "--out", str(run_dir / "bench" / "all_reduce.json")], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = tmp_path / "report.html"
    proc = run_npudist(["report", str(run_dir), "-o", str(html)])
    assert proc.returncode == 0, proc.stderr
    page = html.read_text()
    assert "0 unusable record(s) skipped" in " ".join(proc.stderr.split())
    assert re.search(r"<td[^>]*>run segments \(starts incl\. resumes\)</td><td[^>]*>2</td>", page)
    assert re.search(r"<td[^>]*>last logged step</td><td[^>]*>105</td>", page)

    dom = _chromium(["--dump-dom", html.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The summary card comes first, before any section, and answers how the run went.
    body = dom.stdout
    assert body.index('<dl class="card"') < body.index('<section id="summary"')
    card = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>", body))
    assert card["steps"] == "105" and re.fullmatch(r"\d+\.\d{4}", card["final loss"])
    assert float(card["best loss"]) <= float(card["final loss"])
    assert "train_ddp.py" in card["command"] and card["world"] == "2"
    assert card["versions"].startswith("npudist ") and "torch " in card["versions"]
    # Step axis ticks read as numbers people write (0, 50, 100), never 1E+2 (nice_ticks' Decimals).
    loss_svg = re.search(r'<svg[^>]*data-plot="loss".*?</svg>', body, re.DOTALL).group(0)
    ticks = re.findall(r'text-anchor="(?:middle|end)" font-size="11">([^<]+)</text>', loss_svg)
    assert {"50", "100"} <= set(ticks) and not [t for t in ticks if "e+" in t or "e-" in t], ticks
    plots = re.findall(r'data-plot="([^"]+)" data-series="(\d+)"', dom.stdout)
    # loss and step time: one series per rank; busbw: the one bench file; the one skew window is a value
    assert ("loss", "2") in plots and ("step-time", "2") in plots and ("busbw", "1") in plots
    assert re.search(r'<div class="single" id="plot-skew" data-plot="skew">', body)
    shot = tmp_path / "shot.png"
    run = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", html.as_uri()], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    for output in (dom.stderr, run.stderr):
        console = [line for line in output.splitlines() if re.search(r"CONSOLE|Uncaught|Refused to", line)]
        assert console == []


@pytest.mark.subprocess
def test_the_page_lands_in_the_run_dir_by_default(tmp_path):
    run_dir = write_run(tmp_path / "run")
    proc = run_npudist(["report", str(run_dir)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "report.html").is_file() and not (tmp_path / "report.html").exists()
    assert f"wrote {run_dir / 'report.html'}" in " ".join(proc.stderr.split())


def _shot(page: str, name: str, tmp_path) -> bytes:
    html, png = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
    html.write_text(page)
    run = _chromium([f"--screenshot={png}", "--window-size=900,700", html.as_uri()], tmp_path)
    assert run.returncode == 0 and png.is_file(), run.stderr[-2000:]
    return png.read_bytes()


@pytest.mark.subprocess
@pytest.mark.skipif(CHROMIUM is None, reason="headless check needs Debian's chromium (apt-get install chromium)")
def test_the_loss_toggles_show_the_chart_their_boxes_ask_for_in_chromium(tmp_path):
    from npudist.report import report_html

    full, _ = report_html(write_run(tmp_path / "run"))
    # The loss section alone, under the page's own head, fits the window: no scrolling, nothing else moves.
    page = full[:full.index("<body>") + 6] + re.search(r'<section id="loss">.*?</section>', full, re.DOTALL)[0] \
        + "</body></html>"
    # The page with the boxes ticked as a user leaves them, against the same page from which every other
    # chart was cut and the asked-for one is shown by its own style: equal screenshots mean the stylesheet
    # showed exactly that chart and no other.
    variants = re.findall(r'<div class="variant (v-[a-z]+-[a-z]+)">.*?</svg></figure></div>', page, re.DOTALL)
    assert sorted(variants) == ["v-raw-linear", "v-raw-log", "v-smooth-linear", "v-smooth-log"]
    shots = {}
    for smooth in (False, True):
        for log in (False, True):
            ticked = page
            if smooth:
                ticked = ticked.replace('id="loss-smooth">', 'id="loss-smooth" checked>')
            if log:
                ticked = ticked.replace('id="loss-log">', 'id="loss-log" checked>')
            want = f"v-{'smooth' if smooth else 'raw'}-{'log' if log else 'linear'}"
            alone = re.sub(r'<div class="variant (v-[a-z]+-[a-z]+)">(.*?</svg></figure>)</div>',
                           lambda m, w=want: f'<div style="display: block">{m[2]}</div>' if m[1] == w else "",
                           ticked, flags=re.DOTALL)
            shots[want] = _shot(ticked, want, tmp_path)
            assert shots[want] == _shot(alone, want + "-alone", tmp_path), want
    assert len(set(shots.values())) == 4  # each box changes what is drawn
