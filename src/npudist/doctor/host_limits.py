"""Doctor checks of the host's limits a distributed job runs into: shared memory and open files."""

from __future__ import annotations

from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import OK, SKIP, WARN, CheckResult

GIB = 1 << 30


SHM_MIN_BYTES = GIB


NOFILE_MIN = 65536


@check("shm")
def shm(host: Host) -> CheckResult:
    path = host.path("/dev/shm")
    if not path.exists():
        return CheckResult("shm", SKIP, "/dev/shm does not exist here")
    size = host.fs_size(path)
    finding = f"/dev/shm is {size / GIB:.2f} GiB"
    if size < SHM_MIN_BYTES:
        return CheckResult("shm", WARN, finding + " (gloo/NCCL fail in containers with the 64 MiB default)",
                           "docker run --shm-size=8g (or --ipc=host); Kubernetes: mount an emptyDir "
                           "with medium: Memory at /dev/shm")
    return CheckResult("shm", OK, finding)


@check("open-files")
def open_files(host: Host) -> CheckResult:
    soft, hard = host.nofile()
    finding = f"open-files limit {soft} (hard {hard})"
    if soft == -1 or soft >= NOFILE_MIN:
        return CheckResult("open-files", OK, finding)
    finding += f", below {NOFILE_MIN}: each rank holds sockets to its peers plus data-loader files"
    # `ulimit -n` can raise the soft limit only up to the hard one; past it takes root (limits.conf,
    # systemd LimitNOFILE=, the container runtime's --ulimit).
    raise_hard = (f"the hard limit is {hard}: as root raise nofile to {NOFILE_MIN} in /etc/security/limits.conf "
                  f"(or systemd LimitNOFILE=, docker run --ulimit nofile={NOFILE_MIN}:{NOFILE_MIN}), log in again")
    if hard != -1 and hard < NOFILE_MIN:
        fix = raise_hard + f", then ulimit -n {NOFILE_MIN}"
        if soft < hard:
            fix = f"ulimit -n {hard} now; for {NOFILE_MIN}, " + fix
        return CheckResult("open-files", WARN, finding, fix)
    return CheckResult("open-files", WARN, finding, f"ulimit -n {NOFILE_MIN} (the hard limit {hard} allows it)")
