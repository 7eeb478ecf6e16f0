"""The `npudist` command. Each sub-command is a thin shell over a module that does the work."""

from __future__ import annotations

import os
import sys
from types import MappingProxyType
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from npudist._version import __version__

# Sub-apps whose modules import torch (npudist.comm, the accelerator table): listed by name and help, and
# imported only when run, so `npudist --help` answers without importing torch (torchrun's help does too).
_LAZY = MappingProxyType({
    "bench": ("npudist.bench", "Benchmarks: `npudist bench collective --help`."),
    "deploy": ("npudist.deploy.cli", "Cluster deployments: `npudist deploy k8s|slurm --help`."),
})


class _Commands(TyperGroup):
    """npudist's commands, the _LAZY ones loaded on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in _LAZY if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in _LAZY and cmd_name not in self.commands:  # listed in a help page: name and help only
            return TyperGroup(name=cmd_name, help=_LAZY[cmd_name][1])
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] in _LAZY and args[0] not in self.commands:
            import importlib

            module, text = _LAZY[args[0]]
            holder = typer.Typer()  # as add_typer made it: a group even when the sub-app has one command
            holder.add_typer(importlib.import_module(module).app, name=args[0], help=text)
            self.add_command(typer.main.get_command(holder).commands[args[0]], args[0])
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="npudist",
    cls=_Commands,
    help="Distributed PyTorch on Ascend NPUs, NVIDIA GPUs, Cambricon MLUs, RK3588 boards and CPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, soft_wrap=True)  # a path or command in a message stays whole, to copy


def _version(value: bool) -> None:
    if value:
        typer.echo(f"npudist {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Distributed PyTorch on any accelerator, with Prometheus telemetry."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    help="Start a distributed job: \\[npudist options] \\[torchrun options] SCRIPT \\[ARGS]; --nproc-per-node auto "
    "(the default) uses the detected accelerator's devices. --mpi runs one rank under mpirun. "
    "`npudist launch --help` lists npudist's options, then torchrun's.",
)
def launch(ctx: typer.Context) -> None:
    from rich.markup import escape

    argv = list(ctx.args)
    if argv and argv[0] in ("-h", "--help"):
        from npudist.launch.options import parser

        parser().print_help()
        raise typer.Exit(0)
    from npudist import launch as launcher
    from npudist.accelerators import AcceleratorUnavailable
    from npudist.runtime.numpy_torch import installed_mismatch

    wrong = installed_mismatch()  # a warning, not a refusal: a job that never converts to numpy runs fine
    if wrong:
        err.print(f"[yellow]npudist launch: warning:[/] {escape(wrong)}")
    try:
        if not argv:
            raise launcher.LaunchError(f"give the training script to run (usage: {launcher.USAGE}; see --help)")
        code = launcher.run(argv, launcher.accelerator_for(argv))
    except (launcher.LaunchError, AcceleratorUnavailable, ValueError) as exc:
        err.print(f"[bold red]npudist launch:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command("test", help="Does this set-up run a distributed job? Starts a short job under `npudist launch` (2 "
                           "ranks per node): each collective through the real backend with its result checked, a "
                           "DDP step, a checkpoint saved and loaded; one verdict line per check, exit 1 if one "
                           "fails. Examples: `npudist test`; `npudist test --simulate npu`; on each of 2 hosts "
                           "`npudist test --nnodes 2 --node-rank I --master-addr HOST0 --master-port 29500 "
                           "--checkpoint-dir /shared/dir`.")
def selftest(
    nproc_per_node: int = typer.Option(2, "--nproc-per-node", min=1, help="Ranks on this node."),
    simulate: str = typer.Option(None, "--simulate", help="npu or npu:strict: the simulated Ascend NPU."),
    accelerator: str = typer.Option(None, "--accelerator", help="Run on this accelerator (cpu: gloo whatever "
                                    "the host has); default: the detected one."),
    nnodes: str = typer.Option(None, "--nnodes", help="Hosts in the test (torchrun's --nnodes)."),
    node_rank: int = typer.Option(None, "--node-rank", help="This host's index (torchrun's --node-rank)."),
    master_addr: str = typer.Option(None, "--master-addr", help="The host of node 0."),
    master_port: int = typer.Option(None, "--master-port", help="Its rendezvous port."),
    checkpoint_dir: str = typer.Option(None, "--checkpoint-dir", help="Where the checkpoint check saves; with "
                                       "several hosts a folder every node shares (default: a temporary folder)."),
    out: str = typer.Option(None, "--out", help="Keep the ranks' records and launch log here (default: a "
                            "temporary folder, removed when every check passes)."),
    timeout: float = typer.Option(120.0, "--timeout", min=5, help="Seconds before a check still running is "
                                  "reported as hung and the ranks are stopped."),
) -> None:
    from pathlib import Path

    from npudist.selftest.run import SelfTestOptions, run_selftest

    passed = [("--nnodes", nnodes), ("--node-rank", node_rank), ("--master-addr", master_addr),
              ("--master-port", master_port)]
    opts = SelfTestOptions(nproc_per_node=nproc_per_node, simulate=simulate, accelerator=accelerator,
                       launch_args=tuple(x for name, value in passed if value is not None for x in (name, str(value))),
                       timeout_s=timeout, out=Path(out) if out else None,
                       checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None)
    raise typer.Exit(run_selftest(opts, typer.echo))


_STYLE = MappingProxyType({"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"})


@app.command(help="Check this machine for what breaks distributed jobs; exit 1 if a check fails. Examples: "
                  "`npudist doctor`; `npudist doctor --master-addr host0 --master-port 29500` (on a worker node); "
                  "`npudist doctor --json`.")
def doctor(as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
           table: bool = typer.Option(None, "--table/--compact",
                                      help="A table (default on a terminal) or plain lines (default in a pipe)."),
           show_all: bool = typer.Option(False, "--all", help="Show every check whole, the skipped ones included."),
           master_addr: str = typer.Option(None, "--master-addr", help="Check the route, interface, MTU and "
                                           "rendezvous port towards this host (default: $MASTER_ADDR)."),
           master_port: int = typer.Option(None, "--master-port", help="The rendezvous port (default: "
                                           "$MASTER_PORT, else 29500).")
           ) -> None:
    import json

    from rich.markup import escape
    from rich.table import Table

    from npudist import doctor as doc
    from npudist.doctor.result import compact, environment_block, shown, skipped_line, summary_line

    env = dict(os.environ)
    env.update({k: str(v) for k, v in (("MASTER_ADDR", master_addr), ("MASTER_PORT", master_port)) if v})
    results = doc.run_checks(doc.Host(env=env))
    if as_json:
        typer.echo(json.dumps(doc.as_document(results), indent=2))
        raise typer.Exit(doc.exit_code(results))
    title = f"npudist doctor ({__version__})"
    if not (sys.stdout.isatty() if table is None else table):
        typer.echo("\n".join([*compact(results, title, show_all), *environment_block(os.environ)]))
        raise typer.Exit(doc.exit_code(results))
    grid = Table(title=title, show_lines=False)
    for col in ("check", "status", "finding", "fix"):
        grid.add_column(col, overflow="fold")
    rows, skipped = shown(results, show_all)
    for r in rows:
        grid.add_row(r.name, f"[{_STYLE[r.status]}]{r.status}[/]", escape(r.finding), escape(r.fix))
    if skipped:
        grid.add_row(f"{len(skipped)} checks", f"[{_STYLE['skip']}]skip[/]", escape(skipped_line(skipped) or ""), "")
    Console().print(grid)
    typer.echo(summary_line(results))
    typer.echo("\n".join(environment_block(os.environ)))
    raise typer.Exit(doc.exit_code(results))


def _add_dashboards() -> None:
    from npudist.dashboards.cli import app as dashboards_app

    app.add_typer(dashboards_app, name="dashboards", help="Grafana dashboards and Prometheus rules: export, check.")


_add_dashboards()


def _add_migrate() -> None:
    from npudist.migrate.cli import app as migrate_app

    app.add_typer(migrate_app, name="migrate", help="Port a CUDA training script: `npudist migrate check|fix PATH`.")


_add_migrate()
def _add_edge() -> None:
    from npudist.edge.cli import app as edge_app

    app.add_typer(edge_app, name="edge", help="Rockchip NPU models: `npudist edge convert --help`.")


_add_edge()


def _add_ranktable() -> None:
    from npudist.ranktable.cli import app as ranktable_app

    app.add_typer(ranktable_app, name="ranktable",
                  help="HCCL rank tables: `npudist ranktable write|merge|check --help`.")


_add_ranktable()


@app.command(help="Serve this node's device metrics for Prometheus (DaemonSet or systemd unit). Examples: "
                  "`npudist exporter`; `npudist exporter --listen 0.0.0.0:9400 --source npu-smi --interval 15s`.")
def exporter(
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT; 0.0.0.0:PORT listens on every interface."),
    source: str = typer.Option("auto", help="auto, npu-smi, rknpu, nvml, cpu (or package.module:Class)."),
    interval: str = typer.Option("5s", help="Time between device reads, e.g. 5s, 500ms, 1m."),
    collectors: str = typer.Option("all", help="Reliability/network collectors or families to serve, e.g. "
                                   "all,-optical,-npudist_link_pfc_priority_frames_total "
                                   "(docs/reference/telemetry.md: Reliability)."),
    collectors_file: str = typer.Option(None, help="File of --collectors entries, one per line (# comments)."),
) -> None:
    from npudist.telemetry.exposition import node_exporter as node

    try:
        running = node.start(listen, source, interval, collectors, collectors_file)
    except (node.ExporterError, node.SourceUnavailable) as exc:
        err.print(f"[bold red]npudist exporter:[/] {exc}")
        raise typer.Exit(2) from None
    err.print(f"npudist exporter: serving {running.server.url} (source {source}, every {interval})")
    node.run_forever(running)


@app.command(help="Render RUN_DIR's recorded metrics and benchmarks as one self-contained HTML page. Example: "
                  "`npudist report runs/demo` (writes runs/demo/report.html).")
def report(run_dir: str = typer.Argument(..., help="The job's --run-dir (holds metrics/rank*.jsonl)."),
           out: str = typer.Option(None, "-o", "--out", help="HTML file to write (default RUN_DIR/report.html).")
           ) -> None:
    from npudist.report import ReportError, write_report

    out = out or os.path.join(run_dir, "report.html")
    try:
        data = write_report(run_dir, out)
    except ReportError as exc:
        err.print(f"[bold red]npudist report:[/] {exc}")
        raise typer.Exit(2) from None
    err.print(f"npudist report: wrote {out} ({len(data.problems)} unusable record(s) skipped)")
    if not data.run_logs:
        err.print(f"[yellow]npudist report: warning:[/] {run_dir} holds no run log (metrics/rank*.jsonl), so the "
                  "page has no loss, step time or skew. Make one by running the job with a run directory: "
                  "npudist launch examples/train_ddp.py --run-dir RUN_DIR")


@app.command(help="Read RUN_DIR's hang reports, straggler diagnoses, run log and checkpoints back: what went "
                  "wrong, on which rank, host and card, and what to run next. Exit 1 when something did. "
                  "Examples: `npudist diagnose runs/demo`; `npudist diagnose runs/demo --json`.")
def diagnose(run_dir: str = typer.Argument(..., help="The job's --run-dir."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    import json

    from npudist.report.diagnose import ReportError, lines
    from npudist.report.diagnose import diagnose as read

    try:
        found = read(run_dir)
    except (ReportError, OSError) as exc:
        err.print(f"[bold red]npudist diagnose:[/] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({"verdicts": [x.as_json() for x in found.verdicts],
                               "problems": [vars(p) for p in found.problems],
                               "straggler_files": found.straggler_files}, indent=1))
    else:
        typer.echo("\n".join(lines(found, run_dir)))
    raise typer.Exit(1 if found.verdicts else 0)


@app.command(help="Start a real Prometheus (127.0.0.1) with npudist's rules on a running job's targets file and "
                  "`npudist exporter` for this host's devices, print the URL, run COMMAND (e.g. the job) and keep "
                  "Prometheus up after it until Ctrl-C. `make observe` runs the demo under it. Example: `npudist "
                  "observe -- npudist launch --metrics-port 9500 --targets-file runs/demo/targets.json "
                  "examples/train_ddp.py`.")
def observe(
    command: Annotated[list[str] | None, typer.Argument(
        help="After --: the job to run while Prometheus watches it.")] = None,
    targets_file: str = typer.Option("runs/demo/targets.json", help="The job's `npudist launch --targets-file`."),
    port: int = typer.Option(10190, help="Prometheus's port on 127.0.0.1."),
    out: str = typer.Option("runs/observe", help="Folder for the exported rules, dashboards and Prometheus data."),
    node_target: Annotated[list[str] | None, typer.Option(
        help="`npudist exporter` HOST:PORT to scrape too (repeatable).")] = None,
    prometheus: Annotated[str | None, typer.Option(help="Path of the prometheus binary (default: on PATH).")] = None,
    exporter_port: int = typer.Option(9400, help="Port of the `npudist exporter` started for this host's devices "
                                      "(0: start none)."),
    exporter_source: str = typer.Option("auto", help="Its --source (auto, npu-smi, rknpu, nvml, cpu)."),
    keep: bool = typer.Option(None, "--keep-after/--exit-after", help="Keep Prometheus answering after COMMAND "
                              "ends, until Ctrl-C (default on a terminal), or stop with it."),
) -> None:
    from pathlib import Path

    from npudist.dashboards.observe import ObserveError, ObserveOptions
    from npudist.dashboards.observe import observe as run_observe

    opts = ObserveOptions(targets_file=Path(targets_file), out=Path(out), port=port,
                          node_targets=tuple(node_target or ()), prometheus=prometheus,
                          exporter_port=exporter_port or None, exporter_source=exporter_source,
                          keep=sys.stdin.isatty() if keep is None else keep)
    try:
        code = run_observe(opts, command or ())
    except (ObserveError, OSError) as exc:
        err.print(f"[bold red]npudist observe:[/] {exc}")
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
