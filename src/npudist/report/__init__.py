"""`npudist report RUN_DIR -o report.html`: a self-contained HTML page of what a run recorded.

records.py reads the run directory, model.py computes what to show, svg.py and render.py write markup.
Only report_html()'s load_run() and write_report() touch files.
"""

from __future__ import annotations

from pathlib import Path

from npudist.report.model import ReportData, build
from npudist.report.records import ReportError, RunRecords, load_run
from npudist.report.render import render

__all__ = ["ReportData", "ReportError", "RunRecords", "build", "load_run", "render", "report_html", "write_report"]


def report_html(run_dir: str | Path) -> tuple[str, ReportData]:
    """The page for ``run_dir`` and the data it shows."""
    data = build(load_run(run_dir))
    return render(data, str(run_dir)), data


def write_report(run_dir: str | Path, out: str | Path) -> ReportData:
    """Write the page to ``out`` (its folder is created); ReportError names what was wrong."""
    page, data = report_html(run_dir)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write the report to {str(out)!r}: {exc}; pass -o with a writable path") from None
    return data
