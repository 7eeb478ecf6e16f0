"""The doctor's checks of an Ascend host's devices, as a job will meet them: which devices
ASCEND_RT_VISIBLE_DEVICES leaves visible, devices held by a process that is gone, the device files and
driver libraries a container needs, and the host ports HCCL listens on.

Each reads only the Host it is given (``root`` for /dev, /proc and the driver tree; ``run`` for npu-smi;
``port_free`` for the ports), so the tests run them on fabricated trees and the fake npu-smi.
"""

from __future__ import annotations

from collections.abc import Sequence

from npudist.doctor.ascend import _ascend_host
from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult
from npudist.ranktable.node import VISIBLE_VAR, present_devices, visible_physical
from npudist.ranktable.table import RankTableError


def _on_ascend(host: Host) -> bool:
    return _ascend_host(host) or bool(present_devices(host.root))


def _in_container(host: Host) -> bool:
    return (host.path("/.dockerenv").exists() or host.path("/run/.containerenv").exists()
            or bool(host.env.get("KUBERNETES_SERVICE_HOST")))


def _chip_count(host: Host) -> int | None:
    """Chips with a logical ID in ``npu-smi info -m``, when /dev shows none (a host without the files)."""
    exe = host.which("npu-smi")
    if not exe:
        return None
    from npudist.telemetry.sources.npu_smi.mapping import parse_mapping

    try:
        return len(parse_mapping(host.run([exe, "info", "-m"], host.tool_timeout)))
    except Exception:  # an unusable tool leaves the count unknown; the tools check reports the tool
        return None


_FIX_LIST = "list logical IDs 0..{last}, ascending, comma-separated without spaces (CANN: {var}); devices left out " \
    "silently vanish"
_FIX_UNSEEN = ("the runtime does not open the devices the list selects: check that they are free "
               "(ascend-device-holders) and mounted (ascend-mounts), that the list holds logical IDs of the devices "
               "this host or container holds, ascending, and that it is set before the process starts")
_FIX_PROBE = ("run `python -c 'import torch, torch_npu; print(torch.npu.device_count())'` by hand: a hang or crash "
              "there is the driver or CANN (`npu-smi info`, the ascend-env check)")


def _torch_count(host: Host) -> tuple[int | None, str | None]:
    """(what torch.npu.device_count() says under this environment, why it could not be asked)."""
    from npudist.doctor.npu_probe import ProbeError

    try:
        return host.npu_count(host.env), None
    except ProbeError as exc:
        return None, str(exc)


@check("ascend-visible-devices")
def visible_devices(host: Host) -> CheckResult:
    """ASCEND_RT_VISIBLE_DEVICES against the devices present (/dev/davinciN, else npu-smi) and, where torch_npu
    or the simulated NPU is importable, against what ``torch.npu.device_count()`` reports under it: a list the
    runtime cannot read loses devices without an error."""
    name = "ascend-visible-devices"
    present = present_devices(host.root)
    if not present:
        count = _chip_count(host)
        present = list(range(count)) if count else []
    raw = host.env.get(VISIBLE_VAR)
    seen, why_not = _torch_count(host)
    if not present:
        if seen is None and why_not is None:
            return CheckResult(name, SKIP, "no Ascend device here (/dev/davinciN or `npu-smi info -m`)")
        return _without_tree(host, raw, seen, why_not)
    expected: int | None = None
    if raw is None or not raw.strip():
        expected = len(present)
        found = CheckResult(name, OK, f"{VISIBLE_VAR} unset: all {len(present)} device(s) visible "
                            f"(physical {_ids(present)})")
    else:
        try:
            chosen = visible_physical(raw, present)
        except RankTableError as exc:
            found = CheckResult(name, FAIL, str(exc), _FIX_LIST.format(last=len(present) - 1, var=VISIBLE_VAR))
        else:
            expected = len(chosen)
            found = CheckResult(name, OK, f"{VISIBLE_VAR}={raw}: physical device(s) {_ids(chosen)} of {len(present)}")
    return _against_torch(found, expected, seen, why_not)


def _against_torch(found: CheckResult, expected: int | None, seen: int | None, why_not: str | None) -> CheckResult:
    if why_not is not None:
        return CheckResult(found.name, WARN if found.status == OK else found.status, f"{found.finding}; {why_not}",
                           found.fix or _FIX_PROBE)
    if seen is None:
        return found
    if expected is None:  # the list itself is wrong: the count shows what the runtime made of it
        return CheckResult(found.name, found.status, f"{found.finding}; torch.npu.device_count() is {seen} under it",
                           found.fix)
    if seen != expected:
        return CheckResult(found.name, FAIL, f"{found.finding}, but torch.npu.device_count() is {seen}, not "
                           f"{expected}", _FIX_UNSEEN)
    return CheckResult(found.name, OK, f"{found.finding}; torch.npu.device_count() agrees ({seen})")


def _without_tree(host: Host, raw: str | None, seen: int | None, why_not: str | None) -> CheckResult:
    """No device tree to check against (the simulated NPU, a container without /dev files): the list's form, and
    the count the runtime reports under it."""
    name = "ascend-visible-devices"
    what = "simulated NPU" if host.env.get("NPUDIST_SIMULATE", "").strip() else "torch_npu"
    if why_not is not None:
        return CheckResult(name, WARN, f"no /dev/davinciN or npu-smi here, and {why_not}", _FIX_PROBE)
    listed = [t for t in (raw or "").split(",") if t.strip()]
    if listed:
        try:
            visible_physical(raw, range(1 << 16))  # the form only: nothing says how many devices there are
        except RankTableError as exc:
            return CheckResult(name, FAIL, f"{exc}; torch.npu.device_count() is {seen} under it",
                               _FIX_LIST.format(last="N-1", var=VISIBLE_VAR))
        if seen is not None and seen < len(listed):
            return CheckResult(name, FAIL, f"{VISIBLE_VAR}={raw} lists {len(listed)} device(s), but "
                               f"torch.npu.device_count() is {seen} ({what})", _FIX_UNSEEN)
    shown = f" under {VISIBLE_VAR}={raw}" if listed else ""
    return CheckResult(name, OK, f"torch.npu.device_count() is {seen}{shown} ({what}; no /dev/davinciN to check "
                       "against)")


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


@check("ascend-device-holders")
def device_holders(host: Host) -> CheckResult:
    """A device held by a process that no longer runs keeps its memory and context: the next job on it fails
    to set the device or runs out of memory. npu-smi's process table names the PID; /proc says if it lives."""
    name = "ascend-device-holders"
    exe = host.which("npu-smi")
    if not exe:
        return CheckResult(name, SKIP, "npu-smi not on PATH")
    from npudist.telemetry.sources import npu_smi

    try:
        procs = npu_smi.parse_processes(host.run([exe, "info"], host.tool_timeout))
    except Exception as exc:  # a vendor tool printing garbage must not stop the doctor
        return CheckResult(name, WARN, f"could not read npu-smi's process table: {str(exc)[:160]}",
                           "run `npu-smi info` by hand")
    gone = [p for p in procs if not host.path(f"/proc/{p.pid}").exists()]
    if not gone:
        return CheckResult(name, OK, f"{len(procs)} process(es) hold devices, all running here"
                           if procs else "no process holds a device")
    shown = "; ".join(f"NPU {p.device_id} chip {p.chip_id}: pid {p.pid} ({p.name or '?'}"
                      f"{f', {p.memory_used_bytes // 2**20} MiB' if p.memory_used_bytes else ''})" for p in gone[:8])
    reset = "; ".join(dict.fromkeys(f"npu-smi set -t reset -i {p.device_id} -c {p.chip_id}" for p in gone[:8]))
    if _in_container(host):
        return CheckResult(name, WARN, f"held by processes not visible in this container: {shown}",
                           "they may run in another container; if not, reset the chip on the host: " + reset)
    return CheckResult(name, FAIL, f"held by processes that no longer run: {shown}",
                       "wait a few seconds for the driver to release them; if npu-smi still lists them, reset "
                       f"the chip (root; stops everything on it): {reset}")


# What a container needs from the host to open a device: the chips, the manager, shared-memory and
# host-device channel devices, and the driver's user libraries (MindIE quick start "启动容器", MindCluster
# Ascend Docker Runtime "Usage on the Docker Client": `ls /dev | grep davinci && ... devmm_svm && ...
# hisi_hdc && ls /usr/local/Ascend/driver`). Each row: path, what it is, the docker option that provides it.
_MOUNTS = (
    ("/dev/davinci_manager", "the device manager", "--device=/dev/davinci_manager"),
    ("/dev/devmm_svm", "shared virtual memory", "--device=/dev/devmm_svm"),
    ("/dev/hisi_hdc", "the host-device channel", "--device=/dev/hisi_hdc"),
    ("/usr/local/Ascend/driver/lib64", "the driver's libraries",
     "-v /usr/local/Ascend/driver:/usr/local/Ascend/driver:ro"),
)


@check("ascend-mounts")
def device_mounts(host: Host) -> CheckResult:
    name = "ascend-mounts"
    chips = present_devices(host.root)
    if not chips and not _ascend_host(host):
        return CheckResult(name, SKIP, "not an Ascend host (no /dev/davinciN, CANN, npu-smi or torch_npu)")
    missing = [(path, what, flag) for path, what, flag in _MOUNTS
               if not (host.path(path).is_dir() and any(host.path(path).iterdir())
                       if path.endswith("lib64") else host.path(path).exists())]
    if not chips:
        missing.insert(0, ("/dev/davinciN", "no NPU device", "--device=/dev/davinciN for each NPU"))
    if not missing:
        return CheckResult(name, OK, f"{len(chips)} /dev/davinciN, davinci_manager, devmm_svm, hisi_hdc and the "
                           "driver's lib64 present")
    shown = ", ".join(f"{p} ({w})" for p, w, _ in missing)
    if _in_container(host):
        return CheckResult(name, FAIL, f"this container lacks {shown}: the runtime cannot open a device",
                           "start it with " + " ".join(f for _, _, f in missing) + " (or the Ascend Docker Runtime "
                           "with ASCEND_VISIBLE_DEVICES)")
    return CheckResult(name, FAIL, f"missing {shown}: the driver is not installed or not loaded",
                       "install the Ascend driver and firmware for this card (npu-smi info must list it), then reboot")


HCCL_BASE_PORT, HCCL_PORTS = 60000, 32
"""CANN 8.5 env var reference, HCCL_IF_BASE_PORT: default 60000, range [1024, 65520]; HCCL takes 32 ports
from the base (16 before CANN 8.3) and asks for them to be reserved (net.ipv4.ip_local_reserved_ports)."""


def parse_port_ranges(text: str) -> list[tuple[int, int]]:
    """``/proc/sys/net/ipv4/ip_local_reserved_ports`` (``60000-60031,8080``) or ``ip_local_port_range``
    (``32768<TAB>60999``) -> [(first, last)]."""
    text = text.strip()
    if "\t" in text or (" " in text and "," not in text):
        low, high = text.split()[:2]
        return [(int(low), int(high))]
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        out.append((int(low), int(high or low)))
    return out


def _read_ranges(host: Host, path: str) -> list[tuple[int, int]] | None:
    try:
        return parse_port_ranges(host.path(path).read_text())
    except (OSError, ValueError):
        return None


@check("hccl-ports")
def hccl_ports(host: Host) -> CheckResult:
    name = "hccl-ports"
    if not _on_ascend(host):
        return CheckResult(name, SKIP, "n/a: no NPU on this host (HCCL's host ports)")
    raw = host.env.get("HCCL_IF_BASE_PORT", "").strip()
    if raw and not (raw.isdigit() and 1024 <= int(raw) <= 65520):
        return CheckResult(name, FAIL, f"HCCL_IF_BASE_PORT={raw!r} is not a port in [1024, 65520]",
                           "set an integer in [1024, 65520] or unset it (default 60000)")
    base = int(raw) if raw else HCCL_BASE_PORT
    last = base + HCCL_PORTS - 1
    busy = [p for p in range(base, last + 1) if not host.port_free(p)]
    if busy:
        return CheckResult(name, FAIL, f"port(s) {_ids(busy[:10])}{'...' if len(busy) > 10 else ''} of HCCL's "
                           f"{base}-{last} are in use: HCCL's set-up fails on this node",
                           "stop what holds them (`ss -ltnp`), or move HCCL with HCCL_IF_BASE_PORT on every node")
    ephemeral = _read_ranges(host, "/proc/sys/net/ipv4/ip_local_port_range")
    reserved = _read_ranges(host, "/proc/sys/net/ipv4/ip_local_reserved_ports") or []
    exposed = [p for p in range(base, last + 1)
               if ephemeral and any(lo <= p <= hi for lo, hi in ephemeral)
               and not any(lo <= p <= hi for lo, hi in reserved)]
    if exposed:
        return CheckResult(name, WARN, f"{base}-{last} free now, but {len(exposed)} of them lie in the ephemeral "
                           "range unreserved: any outgoing connection may take one before HCCL does",
                           f"sysctl -w net.ipv4.ip_local_reserved_ports={base}-{last} (CANN: HCCL_IF_BASE_PORT)")
    return CheckResult(name, OK, f"HCCL's host ports {base}-{last} free" + (" and reserved" if reserved else ""))
