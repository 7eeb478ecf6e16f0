"""`npudist migrate check|fix PATH...`: the report and the rewrite, over the files named and nothing else."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True)


def _bf16_refused(profile: str) -> bool:
    import torch

    from npudist.comm.constraints import profile as constraint_row

    try:
        return torch.bfloat16 not in constraint_row(profile).native_dtypes("sum")
    except ValueError as exc:
        err.print(f"[bold red]npudist migrate:[/] {exc}")
        raise typer.Exit(2) from None


def _analyses(paths: list[Path], profile: str):
    """(source, analysis or None, problem or None) per file; a file that does not parse is never fixed."""
    import libcst

    from npudist.migrate.files import sources
    from npudist.migrate.scan import analyse

    refused = _bf16_refused(profile)
    for src in sources(paths):
        if src.text is None:
            yield src, None, f"skipped: {src.skipped}"
            continue
        try:
            yield src, analyse(src.text, bf16_refused=refused), None
        except libcst.ParserSyntaxError as exc:
            yield src, None, f"skipped: does not parse (line {exc.raw_line}, column {exc.raw_column}): " \
                             f"{exc.message}"
        except RecursionError:
            yield src, None, "skipped: nested too deeply to analyse"


_PATHS_HELP = "Python files or directories: read, never imported; fix writes only these."
_PROFILE_HELP = "Constraint row the script must satisfy (hccl, hccl-strict, nccl, cncl...)."


@app.command(help="Report CUDA- and NCCL-only code with file:line, what breaks and the vendor-neutral form.")
def check(
    paths: list[Path] = typer.Argument(..., help=_PATHS_HELP),  # noqa: B008 (typer's declaration style)
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    fail_on: str = typer.Option("error", help="Exit 1 when a finding is at least this severe: "
                                "error, warning, info or never."),
    profile: str = typer.Option("hccl", help=_PROFILE_HELP),
) -> None:
    from npudist.migrate.rules import RULES, SEVERITIES

    if fail_on not in (*SEVERITIES, "never"):
        err.print(f"[bold red]npudist migrate:[/] --fail-on {fail_on!r}: choose error, warning, info or never")
        raise typer.Exit(2)
    rows, problems = [], []
    for src, analysis, problem in _analyses(paths, profile):
        if problem:
            problems.append({"path": str(src.path), "problem": problem})
            continue
        for f in analysis.findings:
            rule = RULES[f.rule]
            rows.append({"path": str(src.path), "line": f.line, "column": f.column, "rule": f.rule,
                         "severity": rule.severity, "code": f.code, "detail": f.detail, "breaks": rule.breaks,
                         "replacement": rule.replacement, "fixable": f.fix is not None})
    counts = {s: sum(r["severity"] == s for r in rows) for s in SEVERITIES}
    worst = max((SEVERITIES.index(r["severity"]) for r in rows), default=-1)
    code = 1 if fail_on != "never" and worst >= SEVERITIES.index(fail_on) else 0
    if as_json:
        typer.echo(json.dumps({"findings": rows, "skipped": problems, "counts": counts, "exit_code": code},
                              indent=2))
        raise typer.Exit(code)
    if rows:
        table = Table(show_lines=False)
        for col in ("where", "severity", "rule", "code", "breaks", "use instead"):
            table.add_column(col, overflow="fold")
        for r in rows:
            why = r["breaks"] + (f" ({r['detail']})" if r["detail"] else "")
            table.add_row(f"{r['path']}:{r['line']}", r["severity"], r["rule"] + (" (fix)" if r["fixable"] else ""),
                          r["code"], why, r["replacement"])
        Console().print(table)
    for p in problems:
        typer.echo(f"{p['path']}: {p['problem']}", err=True)
    fixable = sum(r["fixable"] for r in rows)
    typer.echo(f"{len(rows)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} "
               f"info; {fixable} fixable by `npudist migrate fix`; {len(problems)} file(s) skipped")
    raise typer.Exit(code)


@app.command(help="Rewrite what is mechanical (device, init, DDP, amp); print a diff, or --write in place.")
def fix(
    paths: list[Path] = typer.Argument(..., help=_PATHS_HELP),  # noqa: B008 (typer's declaration style)
    write: bool = typer.Option(False, "--write", help="Write the changes into the files (default: print a diff)."),
    profile: str = typer.Option("hccl", help=_PROFILE_HELP),
) -> None:
    from npudist.migrate.files import write as write_file
    from npudist.migrate.fix import apply
    from npudist.migrate.rules import RULES

    changed = 0
    for src, analysis, problem in _analyses(paths, profile):
        if problem:
            typer.echo(f"{src.path}: {problem}", err=True)
            continue
        result = apply(analysis)
        if result.code != src.text:
            changed += 1
            if write:
                write_file(src.path, result.code)
            else:
                typer.echo("".join(difflib.unified_diff(
                    src.text.splitlines(keepends=True), result.code.splitlines(keepends=True),
                    fromfile=f"a/{src.path}", tofile=f"b/{src.path}")), nl=False)
        for f in result.left:
            typer.echo(f"{src.path}:{f.line}: left for a person: {f.rule}: {f.code} — {RULES[f.rule].breaks}; "
                       f"use {RULES[f.rule].replacement}" + (f" ({f.detail})" if f.detail else ""), err=True)
    verb = "rewrote" if write else "would rewrite"
    typer.echo(f"npudist migrate: {verb} {changed} file(s)", err=True)
