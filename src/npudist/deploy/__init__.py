"""Cluster deployments generated from the same catalogue as the dashboards: Kubernetes and Slurm."""

from npudist.deploy.options import DeployError, JobOptions, K8sOptions, SlurmOptions
from npudist.deploy.placement import PLACEMENTS, HostMount, Placement
from npudist.deploy.write import write_files

__all__ = ["PLACEMENTS", "DeployError", "HostMount", "JobOptions", "K8sOptions", "Placement", "SlurmOptions",
           "write_files"]
