"""`npudist observe`: a real Prometheus on 127.0.0.1 scraping a running job, with npudist's rules loaded.

It exports the dashboards and rules (export.py) with the scrape config pointed at the job's targets file,
starts Debian's ``prometheus`` on them and `npudist exporter` for this host beside the ranks (device series:
the accelerator's, or the host CPU's under vendor="cpu" where there is none), prints the URL to open, runs
the command (the training job) and keeps Prometheus answering after it ends until Ctrl-C (--exit-after: stop
with the job). Both servers run in their own session, so a terminal's Ctrl-C reaches observe, which stops them
and says where the data stays. Grafana is not in this project's package sources (Debian has
no grafana package), so it prints how to start Grafana on the exported provisioning instead of starting one.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npudist.dashboards.export import ExportOptions, export

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class ObserveError(RuntimeError):
    """Observe cannot start as asked; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class ObserveOptions:
    targets_file: Path
    """The file `npudist launch --targets-file` writes (it may not exist yet: Prometheus waits for it)."""
    out: Path
    """Folder for the exported files and Prometheus's data."""
    port: int = 10190
    node_targets: tuple[str, ...] = field(default_factory=tuple)
    prometheus: str | None = None
    """Path of the prometheus binary (None: the one on PATH)."""
    scrape_interval: str = "5s"
    exporter_port: int | None = 9400
    """Port of the `npudist exporter` started for this host (None: start none)."""
    exporter_source: str = "auto"
    keep: bool = True
    """Keep Prometheus up after the command ends, until Ctrl-C."""


def prometheus_binary(given: str | None) -> str:
    found = given or shutil.which("prometheus")
    if not found or not Path(found).is_file():
        raise ObserveError(f"no Prometheus binary{f' at {given}' if given else ' on PATH'}: install Debian's "
                           "(sudo apt-get install prometheus) or pass --prometheus PATH")
    return found


def grafana_hint(out: Path, url: str) -> str:
    """How to see the dashboards: Grafana from its own image, provisioned from the exported folder."""
    return (f"Grafana is not installable from this machine's package sources; to see the dashboards run\n"
            f"  docker run --rm --network host -v {out / 'provisioning'}:/etc/grafana/provisioning:ro "
            f"-v {out / 'grafana'}:/var/lib/grafana/dashboards/npudist:ro grafana/grafana\n"
            f"then open http://127.0.0.1:3000 (admin/admin); its data source is {url}.")


def _port_taken(port: int, option: str = "--port") -> ObserveError:
    return ObserveError(f"port {port} on 127.0.0.1 is already in use by another process (another Prometheus, "
                        f"exporter or `npudist observe`?); stop it or pass {option} with a free port")


def check_port_free(port: int, option: str = "--port") -> None:
    """ObserveError when something already listens on 127.0.0.1:``port``: its /-/ready would answer for ours."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise _port_taken(port, option) from None


def _serves(url: str, tsdb: Path) -> bool:
    """The Prometheus at ``url`` is the one started on ``tsdb`` (its own flags say where its data lives)."""
    try:
        with urllib.request.urlopen(url + "/api/v1/status/flags", timeout=5) as r:
            flags = json.load(r).get("data", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(flags, dict) and flags.get("storage.tsdb.path") == str(tsdb)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, tsdb: Path | None = None) -> None:
    """Return once the Prometheus at ``url`` answers /-/ready and is ``proc`` (its data in ``tsdb``);
    ObserveError if it exits, times out, or another process answers on that port."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise ObserveError(f"prometheus exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    if tsdb is not None and not _serves(url, tsdb):
                        raise _port_taken(int(url.rsplit(":", 1)[1]))
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise ObserveError(f"prometheus not ready at {url} within {timeout:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def exporter_command(opts: ObserveOptions) -> list[str]:
    """`npudist exporter` for this host on 127.0.0.1:exporter_port, as a child of this Python."""
    return [sys.executable, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{opts.exporter_port}",
            "--source", opts.exporter_source, "--interval", opts.scrape_interval]


def _wait_for(prom: subprocess.Popen, out: Path) -> None:
    """Until Ctrl-C; ObserveError when Prometheus (``prom``) exits on its own."""
    while prom.poll() is None:
        time.sleep(1)
    raise ObserveError(f"prometheus exited with {prom.returncode}; see {out / 'prometheus.log'}")


def observe(opts: ObserveOptions, command: Sequence[str] = (), say: Callable[[str], None] = print) -> int:
    """Start Prometheus and this host's exporter, print where to look, run ``command``, then (``keep``) keep
    Prometheus answering until Ctrl-C; stop both and say where the data stays.

    Returns the command's exit code (0 without a command)."""
    binary = prometheus_binary(opts.prometheus)
    check_port_free(opts.port)
    if opts.exporter_port is not None:
        check_port_free(opts.exporter_port, "--exporter-port")
    url = f"http://127.0.0.1:{opts.port}"
    out = opts.out.resolve()
    nodes = (*opts.node_targets, *((f"127.0.0.1:{opts.exporter_port}",) if opts.exporter_port is not None else ()))
    export(out, ExportOptions(targets_file=str(opts.targets_file.resolve()), node_targets=nodes,
                              scrape_interval=opts.scrape_interval, prometheus_url=url,
                              dashboards_path="/var/lib/grafana/dashboards/npudist"))
    children: list[subprocess.Popen] = []
    logs = [(out / name).open("w") for name in ("prometheus.log", "exporter.log")]
    code = 0
    try:
        if opts.exporter_port is not None:
            children.append(subprocess.Popen(exporter_command(opts), stdout=logs[1], stderr=subprocess.STDOUT,
                                             start_new_session=True))
        proc = subprocess.Popen([binary, f"--config.file={out / 'prometheus' / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={out / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{opts.port}"],
                                stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True)
        children.append(proc)
        wait_ready(url, proc, READY_TIMEOUT_S, out / "tsdb")
        say(f"npudist observe: Prometheus at {url}  (targets: {url}/targets, alerts: {url}/alerts, "
            f"loss: {url}/graph?g0.expr=npudist_training_loss, cards: {url}/graph?g0.expr=npudist_device_up)")
        say(f"npudist observe: scraping the ranks listed in {opts.targets_file}; log in {out / 'prometheus.log'}")
        if opts.exporter_port is not None:
            say(f"npudist observe: this host's devices from `npudist exporter --source {opts.exporter_source}` on "
                f"127.0.0.1:{opts.exporter_port} (with no accelerator: the host CPU, vendor=\"cpu\"); log in "
                f"{out / 'exporter.log'}")
        say(grafana_hint(out, url))
        if command:
            code = subprocess.run(list(command), check=False).returncode
            if not opts.keep:
                return code
            say(f"npudist observe: the job ended (exit {code}); Prometheus keeps answering at {url} with its data. "
                "Ctrl-C to stop.")
        else:
            say("npudist observe: Ctrl-C to stop")
        _wait_for(proc, out)
        return code
    except KeyboardInterrupt:
        say(f"npudist observe: stopped; data kept in {out / 'tsdb'} (`npudist observe --out {opts.out}` shows it "
            "again)")
        return code
    finally:
        for child in reversed(children):
            _stop(child)
        for log in logs:
            log.close()
