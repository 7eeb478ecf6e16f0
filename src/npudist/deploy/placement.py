"""Where an accelerator's pods go and what they need from the host, as one row per accelerator.

The generators (k8s_*.py, slurm.py) read these rows and never branch on an accelerator's name; a new
accelerator is a new row. The telemetry source comes from the vendor table (accelerators/vendors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from npudist.accelerators.vendors import BY_NAME


@dataclass(frozen=True)
class HostMount:
    """A read-only hostPath volume (Kubernetes) that a vendor tool or runtime needs inside the pod."""

    name: str
    path: str
    kind: str
    """hostPath type: Directory or File (the kubelet refuses to start the pod when it is missing)."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    accelerator: str
    """A name from the vendor table (``--accelerator``)."""
    resource: str | None
    """Extended resource the vendor's device plugin advertises, one per device; None: none needed."""
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, str], ...] = ()
    """Taints the vendor's device nodes commonly carry (the device plugin's own DaemonSet tolerates them)."""
    exporter_mounts: tuple[HostMount, ...] = ()
    job_mounts: tuple[HostMount, ...] = ()
    exporter_env: Mapping[str, str] = field(default_factory=dict)
    privileged_because: str | None = None
    """Why the exporter must run as root (and privileged in a pod); None: an unprivileged user will do."""
    default_nproc: int = 8
    shm_size: str = "16Gi"
    """/dev/shm per training pod (memory-backed emptyDir); torch's data loaders and gloo use it."""
    slurm_gres: str | None = None
    """Generic resource name in the site's gres.conf (``#SBATCH --gres=NAME:COUNT``)."""

    def __post_init__(self) -> None:
        # Rows are shared constants: their mappings are read-only views.
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))
        object.__setattr__(self, "tolerations", tuple(MappingProxyType(dict(t)) for t in self.tolerations))
        object.__setattr__(self, "exporter_env", MappingProxyType(dict(self.exporter_env)))

    @property
    def telemetry_source(self) -> str:
        return BY_NAME[self.accelerator].telemetry_source


# Ascend: resource and node label of Huawei's device plugin (gitee.com/ascend/ascend-device-plugin,
# MindX DL install guide: `kubectl label node N accelerator=huawei-Ascend910`); driver, dcmi and npu-smi
# paths as Huawei's own npu-exporter DaemonSet and CANN container guides mount them
# (Ascend/ascend-npu-exporter build/npu-exporter.yaml: /usr/local/Ascend/driver, /usr/local/dcmi).
_ASCEND_DRIVER = HostMount("ascend-driver", "/usr/local/Ascend/driver", "Directory")
_NPU = Placement(
    accelerator="npu",
    resource="huawei.com/Ascend910",
    node_selector={"accelerator": "huawei-Ascend910"},
    tolerations=({"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"},),
    exporter_mounts=(
        HostMount("npu-smi", "/usr/local/sbin/npu-smi", "File"),
        _ASCEND_DRIVER,
        HostMount("ascend-dcmi", "/usr/local/dcmi", "Directory"),
        HostMount("ascend-install-info", "/etc/ascend_install.info", "File"),
    ),
    job_mounts=(_ASCEND_DRIVER,),
    # npu-smi loads the driver's and dcmi's libraries; /usr/local/sbin is on the PATH of common base images.
    exporter_env={"LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/common:"
                                     "/usr/local/Ascend/driver/lib64/driver:/usr/local/dcmi"},
    privileged_because=(
        "npu-smi runs as root and opens /dev/davinci_manager, /dev/hisi_hdc, /dev/devmm_svm and every "
        "/dev/davinciN; in a pod the device cgroup admits only the NPUs the device plugin allocated, and an "
        "exporter must read every chip without holding one (Huawei's npu-exporter DaemonSet runs privileged "
        "for the same reason)"),
    slurm_gres="npu",
)

# NVIDIA: resource of the NVIDIA device plugin, node label of GPU feature discovery (GPU Operator). With
# NVIDIA_VISIBLE_DEVICES=all the container toolkit injects every GPU and libnvidia-ml without allocating
# one (how dcgm-exporter runs), so NVML needs no privilege; the image needs `npudist[nvidia]`.
_CUDA = Placement(
    accelerator="cuda",
    resource="nvidia.com/gpu",
    node_selector={"nvidia.com/gpu.present": "true"},
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    exporter_env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
    slurm_gres="gpu",
)

# CPU: psutil reads /proc, which shows the whole node's CPU and memory from any container.
_CPU = Placement(
    accelerator="cpu",
    resource=None,
    node_selector={"kubernetes.io/os": "linux"},
    default_nproc=2,
    shm_size="1Gi",
)

PLACEMENTS: Mapping[str, Placement] = MappingProxyType({p.accelerator: p for p in (_NPU, _CUDA, _CPU)})

NOT_YET: Mapping[str, str] = MappingProxyType({
    "mlu": "no Cambricon row yet: its device plugin's resource name, node label and the host mounts cnmon "
           "needs have not been checked on a real MLU cluster; run `npudist launch` on the nodes directly meanwhile",
    "rknpu": "RK3588 boards have no Kubernetes device plugin or Slurm GRES to place ranks with; start one "
             "rank per board with `npudist launch --mpi` under mpirun",
})
"""Accelerators npudist runs on but cannot deploy yet, with the reason (said instead of 'unknown')."""
