"""``npudist dashboards export|check``: the typer group cli.py registers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from npudist.dashboards.rules import RUNBOOK_URL, runbook_url_problem

if TYPE_CHECKING:
    from npudist.dashboards.export import ExportOptions

app = typer.Typer(no_args_is_help=True, help="Grafana dashboards and Prometheus rules for npudist metrics.")
err = Console(stderr=True, soft_wrap=True)  # a path or command in a message stays whole, to copy


@app.command("export", help="Write grafana/*.json, prometheus/{rules,prometheus}.yml and Grafana provisioning, "
                             "then say what to do with them. Example: `npudist dashboards export --out deploy/ "
                             "--targets-file /etc/prometheus/sd/npudist.json`.")
def export_cmd(
    out: Annotated[Path, typer.Option("--out", help="Folder to write into (created).")],
    targets_file: str = typer.Option("/etc/prometheus/sd/npudist.json",
                                     help="The file `npudist launch --targets-file` writes."),
    node_target: Annotated[list[str] | None, typer.Option(
        help="`npudist exporter` HOST:PORT (repeatable; default 127.0.0.1:9400).")] = None,
    scrape_interval: str = typer.Option("15s", help="Prometheus scrape and rule evaluation interval."),
    prometheus_url: str = typer.Option("http://prometheus:9090", help="How Grafana reaches Prometheus."),
    runbook_url: str = typer.Option(RUNBOOK_URL, help="Absolute URL of docs/runbook.md for your on-call; each "
                                    "alert's runbook_url annotation links to its section."),
) -> None:
    from npudist.dashboards.export import ExportOptions, export

    problem = runbook_url_problem(runbook_url)
    if problem is not None:
        err.print(f"[bold red]npudist dashboards export:[/] --runbook-url {escape(problem)}")
        raise typer.Exit(2)
    opts = ExportOptions(targets_file=targets_file, node_targets=tuple(node_target or ["127.0.0.1:9400"]),
                         scrape_interval=scrape_interval, prometheus_url=prometheus_url, runbook_url=runbook_url)
    try:
        written = export(out, opts)
    except OSError as exc:
        err.print(f"[bold red]npudist dashboards export:[/] cannot write under {out}: {exc}")
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(str(path))
    for line in next_steps(out, opts):  # stderr: stdout stays the list of files, for scripts
        err.print(escape(line))


def next_steps(out: Path, opts: ExportOptions) -> list[str]:
    """What to do with the exported folder: check it, point Prometheus and Grafana at it, feed it a job."""
    return [
        "next steps:",
        f"  check the files:  npudist dashboards check {out}",
        f"  Prometheus:       prometheus --config.file={out / 'prometheus' / 'prometheus.yml'}  (the rules load "
        "from beside it)",
        f"  a job to scrape:  npudist launch --metrics-port 9500 --targets-file {opts.targets_file} train.py",
        f"  Grafana:          copy {out / 'provisioning'} to /etc/grafana/provisioning and {out / 'grafana'} to "
        f"{opts.dashboards_path}, then restart Grafana",
        "  or all at once on this host: npudist observe -- npudist launch --metrics-port 9500 --targets-file "
        "runs/demo/targets.json train.py  (docs/guide/observing.md)",
    ]


@app.command("check", help="Validate an exported folder: JSON structure, PromQL, metric names. Exit 1 on problems. "
                            "Example: `npudist dashboards check deploy/`.")
def check_cmd(folder: Annotated[Path, typer.Argument(help="Folder written by `npudist dashboards export`.")]) -> None:
    from npudist.dashboards.check import check_dir

    if not folder.is_dir():
        err.print(f"[bold red]npudist dashboards check:[/] {folder} is not a folder; "
                  f"run `npudist dashboards export --out {folder}` first")
        raise typer.Exit(2)
    res = check_dir(folder)
    for note in res.notes:
        err.print(f"[yellow]note:[/] {note}")
    for problem in res.problems:
        err.print(f"[bold red]problem:[/] {problem}")
    typer.echo(f"{folder}: {res.queries} dashboard queries, {len(res.problems)} problem(s)")
    raise typer.Exit(1 if res.problems else 0)
