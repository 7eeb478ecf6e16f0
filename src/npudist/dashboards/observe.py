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

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npudist.dashboards.export import ExportOptions, export
from npudist.dashboards.owned import die_with_parent

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
    """ObserveError when something already listens on 127.0.0.1:``port``: its /-/ready would answer for ours.

    SO_REUSEADDR as the servers themselves bind (Go's net package and Python's http.server set it): without
    it a port whose last connections are in TIME_WAIT (for 60 s after a previous observe stopped) reads as
    taken although nothing listens there and Prometheus would start fine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


UI_PAGES = ("targets", "alerts", "graph")
"""Prometheus's web pages observe points at. Debian's Prometheus 2.42 is built without the React UI and
serves them under /classic/ only (/targets answers 404); upstream 2.x serves both, 3.x only /targets."""


def ui_links(url: str, answers: Callable[[str], bool]) -> dict[str, str]:
    """Each page's URL on the Prometheus at ``url``: the plain path where it ``answers``, else /classic/."""
    return {page: next((url + path for path in (f"/{page}", f"/classic/{page}") if answers(url + path)),
                       f"{url}/{page}") for page in UI_PAGES}


def page_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
JOB_STOP_TIMEOUT_S = 90.0
"""How long the job gets to stop after the forwarded signal (torchrun gives its ranks 30 s, then the ranks
write their last records) before its process group is killed."""


class _Stop:
    """The first stop signal observe received (SIGINT from a terminal, SIGTERM, SIGHUP), set by handlers."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum


@contextlib.contextmanager
def _stop_signals(stop: _Stop) -> Iterator[None]:
    """Stop signals set ``stop`` instead of ending observe mid-way (SIGTERM and SIGHUP used to skip the
    clean-up, leaving Prometheus running); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run_job(command: Sequence[str], stop: _Stop, say: Callable[[str], None]) -> int:
    """Run the job in its own session, so a terminal's Ctrl-C reaches observe only; pass the first stop signal
    on to the job's whole process group once (as the terminal would have) and wait for it to stop."""
    job = subprocess.Popen(list(command), start_new_session=True)
    forwarded_at: float | None = None
    while True:
        try:
            return job.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if stop.signum is not None and forwarded_at is None:
            say(f"npudist observe: {signal.Signals(stop.signum).name} passed on to the job; waiting for it to "
                f"stop (up to {JOB_STOP_TIMEOUT_S:.0f} s)")
            _signal_group(job, stop.signum)
            forwarded_at = time.monotonic()
        elif forwarded_at is not None and time.monotonic() - forwarded_at > JOB_STOP_TIMEOUT_S:
            say(f"npudist observe: the job did not stop within {JOB_STOP_TIMEOUT_S:.0f} s; killing it")
            _signal_group(job, signal.SIGKILL)
            return job.wait()


def _signal_group(job: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(job.pid, signum)


def listed_targets(path: Path) -> int:
    """Targets the file still lists (0 when it is missing or unreadable: nothing for Prometheus to scrape)."""
    try:
        groups = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    return sum(len(g.get("targets", [])) for g in groups if isinstance(g, dict)) if isinstance(groups, list) else 0


def _wait_for(prom: subprocess.Popen, out: Path, stop: _Stop) -> None:
    """Until a stop signal; ObserveError when Prometheus (``prom``) exits on its own."""
    while prom.poll() is None:
        if stop.signum is not None:
            return
        time.sleep(0.2)
    raise ObserveError(f"prometheus exited with {prom.returncode}; see {out / 'prometheus.log'}")


def observe(opts: ObserveOptions, command: Sequence[str] = (), say: Callable[[str], None] = print) -> int:
    """Start Prometheus and this host's exporter, print where to look, run ``command``, then (``keep``) keep
    Prometheus answering until a stop signal; stop the job first, then both servers, and say where the data
    stays. The servers die with observe even when it is killed (owned.die_with_parent).

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
    code, stop = 0, _Stop()
    try:
        with _stop_signals(stop):
            if opts.exporter_port is not None:
                children.append(subprocess.Popen(exporter_command(opts), stdout=logs[1], stderr=subprocess.STDOUT,
                                                 start_new_session=True, preexec_fn=die_with_parent()))
            proc = subprocess.Popen([binary, f"--config.file={out / 'prometheus' / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={out / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{opts.port}"],
                                    stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent())
            children.append(proc)
            wait_ready(url, proc, READY_TIMEOUT_S, out / "tsdb")
            if stop.signum is not None:  # asked to stop while Prometheus started: the job never runs
                return _stopped(code, stop, out, opts, say)
            links = ui_links(url, page_answers)
            say(f"npudist observe: Prometheus at {url}  (targets: {links['targets']}, alerts: {links['alerts']}, "
                f"loss: {links['graph']}?g0.expr=npudist_training_loss, "
                f"cards: {links['graph']}?g0.expr=npudist_device_up)")
            say(f"npudist observe: scraping the ranks listed in {opts.targets_file}; log in "
                f"{out / 'prometheus.log'}")
            if opts.exporter_port is not None:
                say(f"npudist observe: this host's devices from `npudist exporter --source {opts.exporter_source}` "
                    f"on 127.0.0.1:{opts.exporter_port} (with no accelerator: the host CPU, vendor=\"cpu\"); log in "
                    f"{out / 'exporter.log'}")
            say(grafana_hint(out, url))
            if command:
                code = _run_job(command, stop, say)
                left = listed_targets(opts.targets_file)
                if left:
                    say(f"npudist observe: the job ended but {opts.targets_file} still lists {left} target(s); "
                        "Prometheus will report them down")
                if not opts.keep or stop.signum is not None:
                    return _stopped(code, stop, out, opts, say)
                say(f"npudist observe: the job ended (exit {code}); Prometheus keeps answering at {url} with its "
                    "data. Ctrl-C to stop.")
            else:
                say("npudist observe: Ctrl-C to stop")
            _wait_for(proc, out, stop)
            return _stopped(code, stop, out, opts, say)
    finally:
        for child in reversed(children):
            _stop(child)
        for log in logs:
            log.close()


def _stopped(code: int, stop: _Stop, out: Path, opts: ObserveOptions, say: Callable[[str], None]) -> int:
    if stop.signum is not None:
        say(f"npudist observe: stopped; data kept in {out / 'tsdb'} (`npudist observe --out {opts.out}` shows it "
            "again)")
    return code
