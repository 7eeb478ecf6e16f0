"""``npudist ranktable write|merge|check``: the typer group cli.py registers (no torch import)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from npudist.ranktable.table import RankTableError
from npudist.runtime.env import launcher_env

app = typer.Typer(no_args_is_help=True, help="HCCL rank tables (RANK_TABLE_FILE) for Ascend multi-node jobs.")
err = Console(stderr=True, soft_wrap=True)


def _fail(cmd: str, message: str) -> typer.Exit:
    err.print(f"[bold red]npudist ranktable {cmd}:[/] {escape(message)}")
    return typer.Exit(2)


def _ids(raw: str | None, what: str) -> list[str] | None:
    if raw is None:
        return None
    items = [x.strip() for x in raw.split(",")]
    if not all(x.isdigit() for x in items):
        raise RankTableError(f"{what}={raw!r}: give comma-separated numbers, e.g. 0,1,2,3")
    return items


@app.command("write", help="Write this node's rank table (one server; version 1.2 with --super-pod-id) from "
                           "`hccn_tool -i N -ip -g` or /etc/hccn.conf; `merge` joins the nodes' tables.")
def write_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Table file to write (JSON).")],
    master_addr: str = typer.Option(None, help="The master's address: the host address is taken from the "
                                    "interface that routes to it (default: $MASTER_ADDR)."),
    host_ip: str = typer.Option(None, help="This host's address, instead of the route to the master."),
    devices: str = typer.Option(None, help="Physical device IDs to list (default: /dev/davinciN through "
                                "$ASCEND_RT_VISIBLE_DEVICES)."),
    root: str = typer.Option("/", help="Where /dev and /etc/hccn.conf are read (tests, chroots)."),
    super_pod_id: str = typer.Option(None, help="This server's SuperPoD (Atlas A3): writes version 1.2."),
    super_device_ids: str = typer.Option(None, help="With --super-pod-id: each listed device's super_device_id "
                                         "(`npu-smi info -t spod-info`), comma-separated, in device order."),
) -> None:
    from npudist.ranktable.read import save, this_node
    from npudist.ranktable.table import build

    try:
        if (super_pod_id is None) != (super_device_ids is None):
            raise RankTableError("--super-pod-id and --super-device-ids go together (version 1.2)")
        phys = _ids(devices, "--devices")
        master_addr = master_addr or launcher_env(os.environ).master_addr or None
        node = this_node(root=Path(root), env=os.environ, master_addr=master_addr,
                         host_ip=host_ip, devices=[int(d) for d in phys] if phys else None,
                         super_pod_id=super_pod_id, super_device_ids=_ids(super_device_ids, "--super-device-ids"))
        table = build([node])
        save(table, out)
    except RankTableError as exc:
        raise _fail("write", str(exc)) from None
    except OSError as exc:
        raise _fail("write", f"cannot write {out}: {exc}") from None
    ids = ",".join(str(d.device_id) for d in node.devices)
    err.print(f"npudist ranktable write: {out}: server {node.server_id}, devices {ids}, version {table['version']}")


@app.command("merge", help="Join node tables (from `write` on each node) into one, ranks numbered in the order "
                           "given; the result is checked before it is written.")
def merge_cmd(
    tables: Annotated[list[Path], typer.Argument(help="Node tables, in node-rank order.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Cluster table to write.")],
) -> None:
    from npudist.ranktable.read import load, save
    from npudist.ranktable.table import build, check, nodes_of

    try:
        nodes = []
        for path in tables:
            doc = load(path)
            defects = check(doc)
            if defects:
                raise RankTableError(f"{path}: " + "; ".join(d.line() for d in defects))
            nodes += nodes_of(doc)
        merged = build(nodes)
        defects = check(merged)
        if defects:
            raise RankTableError("the merged table: " + "; ".join(d.line() for d in defects))
        save(merged, out)
    except RankTableError as exc:
        raise _fail("merge", str(exc)) from None
    except OSError as exc:
        raise _fail("merge", f"cannot write {out}: {exc}") from None
    ranks = sum(len(n.devices) for n in nodes)
    err.print(f"npudist ranktable merge: {out}: {len(nodes)} servers, {ranks} ranks, version {merged['version']}")


@app.command("check", help="Validate a rank table (shape, status, server_count, rank_id 0..N-1, device IPs, "
                           "loopback hosts, SuperPoD ranks); each defect names its field. Exit 1 on defects.")
def check_cmd(table: Annotated[Path, typer.Argument(help="The rank table (RANK_TABLE_FILE).")]) -> None:
    from npudist.ranktable.read import load
    from npudist.ranktable.table import check

    try:
        doc = load(table)
    except RankTableError as exc:
        raise _fail("check", str(exc)) from None
    defects = check(doc)
    for d in defects:
        typer.echo(f"defect  {d.field}: {d.problem}")
        typer.echo(f"        fix: {d.fix}")
    if defects:
        typer.echo(f"{table}: {len(defects)} defect(s)")
        raise typer.Exit(1)
    ranks = sum(len(s["device"]) for s in doc["server_list"])
    typer.echo(f"{table}: ok, version {doc['version']}, {len(doc['server_list'])} servers, {ranks} ranks")
