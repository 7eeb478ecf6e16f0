"""The ``node`` label every npudist exporter puts on its metrics.

Dashboards and rules join rank metrics to device metrics ``on (node)``, so both must name the machine
the same way. In a Kubernetes pod the hostname is the pod's name, not the node's: the generated
manifests set NPUDIST_NODE_NAME from the downward API (``spec.nodeName``) for that reason.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from npudist.runtime.settings import Settings


def node_name(env: Mapping[str, str] | None = None) -> str:
    """NPUDIST_NODE_NAME (Settings.node_name) when set, else this host's name."""
    return Settings.from_env(env).node_name or socket.gethostname()
