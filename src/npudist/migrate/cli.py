"""`npudist migrate check|fix PATH...`: the report and the rewrite, over the files named and nothing else."""

from __future__ import annotations

import difflib
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True, soft_wrap=True)  # a path or command in a message stays whole, to copy


def _bf16_refused(profile: str) -> bool:
    import torch

    from npudist.comm.constraints import profile as constraint_row

    try:
        return torch.bfloat16 not in constraint_row(profile).native_dtypes("sum")
    except ValueError as exc:
        err.print(f"[bold red]npudist migrate:[/] {exc}")
        raise typer.Exit(2) from None


def _analyses(paths: list[Path], profile: str, include_installed: bool = False):
    """(source, analysis or None, problem or None) per file; a file that does not parse is never fixed."""
    import libcst

    from npudist.migrate.files import sources
    from npudist.migrate.scan import analyse

    refused = _bf16_refused(profile)
    for src in sources(paths, include_installed=include_installed):
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
_INSTALLED_HELP = "Also enter virtual environments and site-packages (recognised by pyvenv.cfg / *.dist-info)."


def _rows(src, analysis) -> list[dict]:
    return [_row_of(src, f) for f in analysis.findings]


@app.command(help="Report CUDA- and NCCL-only code: file:line:col, rule, what breaks and the vendor-neutral form.")
def check(
    paths: list[Path] = typer.Argument(..., help=_PATHS_HELP),  # noqa: B008 (typer's declaration style)
    fmt: str = typer.Option("line", "--format", help="line (file:line:col: RULE ...), table, json or csv."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    fail_on: str = typer.Option("error", help="Exit 1 when a finding is at least this severe: "
                                "error, warning, info or never."),
    profile: str = typer.Option("hccl", help=_PROFILE_HELP),
    include_installed: bool = typer.Option(False, "--include-installed", help=_INSTALLED_HELP),
) -> None:
    from npudist.migrate import report
    from npudist.migrate.rules import SEVERITIES
    from npudist.migrate.scan import uses_transfer_to_npu

    fmt = "json" if as_json else fmt
    if fmt not in report.FORMATS:
        err.print(f"[bold red]npudist migrate:[/] --format {fmt!r}: choose {', '.join(report.FORMATS)}")
        raise typer.Exit(2)
    if fail_on not in (*SEVERITIES, "never"):
        err.print(f"[bold red]npudist migrate:[/] --fail-on {fail_on!r}: choose error, warning, info or never")
        raise typer.Exit(2)
    rows, problems, patched = [], [], []
    for src, analysis, problem in _analyses(paths, profile, include_installed):
        if problem:
            problems.append({"path": str(src.path), "problem": problem})
            continue
        rows.extend(_rows(src, analysis))
        if uses_transfer_to_npu(analysis):
            patched.append(str(src.path))
    counts = {s: sum(r["severity"] == s for r in rows) for s in SEVERITIES}
    worst = max((SEVERITIES.index(r["severity"]) for r in rows), default=-1)
    code = 1 if fail_on != "never" and worst >= SEVERITIES.index(fail_on) else 0
    if fmt == "json":
        typer.echo(report.as_json(rows, problems, counts, code, patched), nl=False)
        raise typer.Exit(code)
    if fmt == "csv":
        typer.echo(report.as_csv(rows), nl=False)
        raise typer.Exit(code)
    if fmt == "table" and rows:
        table = Table(show_lines=False)
        for col in ("where", "severity", "rule", "code", "breaks", "use instead"):
            table.add_column(col, overflow="fold")
        for r in rows:
            why = r["breaks"] + (f" ({r['detail']})" if r["detail"] else "")
            table.add_row(f"{r['path']}:{r['line']}", r["severity"], r["rule"] + (" (fix)" if r["fixable"] else ""),
                          r["code"], why, r["replacement"])
        Console().print(table)
    elif fmt == "line":
        typer.echo(report.as_lines(rows), nl=False)
    for p in problems:
        typer.echo(f"{p['path']}: {p['problem']}", err=True)
    for p in patched:
        typer.echo(f"{p}: imports torch_npu's transfer_to_npu: it runs on Ascend by patching torch.cuda; the "
                   "findings matter for CPU CI, GPUs, MLUs and RK3588 boards", err=True)
    fixable = sum(r["fixable"] for r in rows)
    typer.echo(f"{len(rows)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} "
               f"info; {fixable} fixable by `npudist migrate fix`; {len(problems)} file(s) skipped")
    raise typer.Exit(code)


@app.command(help="Rewrite what is mechanical (device, init, DDP, amp); print a diff, --write in place, "
                  "or --out DIR for a converted copy and its change list. Exits 1 when an error-level line is "
                  "left for a person (the script still stops off CUDA) or a file could not be written.")
def fix(
    paths: list[Path] = typer.Argument(..., help=_PATHS_HELP),  # noqa: B008 (typer's declaration style)
    write: bool = typer.Option(False, "--write", help="Write the changes into the files (default: print a diff)."),
    out: Path | None = typer.Option(None, "--out", help="Write converted copies under this directory, with "  # noqa: B008
                                    "CHANGES.txt listing what was fixed and what is left; the sources stay."),
    profile: str = typer.Option("hccl", help=_PROFILE_HELP),
    include_installed: bool = typer.Option(False, "--include-installed", help=_INSTALLED_HELP),
) -> None:
    from npudist.migrate import report
    from npudist.migrate.files import write as write_file
    from npudist.migrate.fix import apply

    if write and out is not None:
        err.print("[bold red]npudist migrate:[/] --write and --out: choose one (in place, or a copy)")
        raise typer.Exit(2)
    changed, failed, changes, blocking = 0, 0, [], 0
    for src, analysis, problem in _analyses(paths, profile, include_installed):
        if problem:
            typer.echo(f"{src.path}: {problem}", err=True)
            continue
        result = apply(analysis)
        blocking += len(result.blocking)
        for f in result.applied:
            changes.append("fixed " + report.line(_row_of(src, f)))
        for f in result.left:
            line = report.line(_row_of(src, f))
            changes.append("left  " + line)
            typer.echo(f"left for a person: {line}", err=True)
        if result.code != src.text:
            changed += 1
        try:
            if out is not None:
                target = out / _relative(src.path, paths)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(result.code, encoding="utf-8")
            elif write and result.code != src.text:
                write_file(src.path, result.code)
            elif not write and result.code != src.text:
                typer.echo("".join(difflib.unified_diff(
                    src.text.splitlines(keepends=True), result.code.splitlines(keepends=True),
                    fromfile=f"a/{src.path}", tofile=f"b/{src.path}")), nl=False)
        except OSError as exc:  # this file stays as it was; the others go on
            failed += 1
            typer.echo(f"{src.path}: not written: {exc}", err=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "CHANGES.txt").write_text("\n".join(changes) + ("\n" if changes else ""), encoding="utf-8")
    verb = "rewrote" if write or out is not None else "would rewrite"
    where = f" into {out}" if out is not None else ""
    typer.echo(f"npudist migrate: {verb} {changed} file(s){where}; {failed} not written", err=True)
    if blocking:
        # The rewrite is still written: what is left is listed above with its rule's reason.
        typer.echo(f"npudist migrate: {blocking} line(s) left (errors above) still stop the script off CUDA: it "
                   "is not runnable on other devices until a person changes them", err=True)
    if failed or blocking:
        raise typer.Exit(1)


def _row_of(src, f) -> dict:
    from npudist.migrate.rules import RULES

    rule = RULES[f.rule]
    return {"path": str(src.path), "line": f.line, "column": f.column, "rule": f.rule, "severity": rule.severity,
            "code": f.code, "detail": f.detail, "breaks": rule.breaks, "replacement": rule.replacement,
            "fixable": f.fix is not None}


def _relative(path: Path, roots: list[Path]) -> Path:
    """Where a source goes under --out: its path below the directory given, or its name for a file given."""
    for root in roots:
        if root.is_dir() and path.is_relative_to(root):
            return path.relative_to(root)
    return Path(path.name)
