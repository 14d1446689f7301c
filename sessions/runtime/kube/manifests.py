"""The objects beside a notebook server's pod, in the API's own shape: the person's work volume and the network
policy that lets the server reach the hub alone; and the hardening every user pod gets. The pod itself is
KubeSpawner's (``sessions.notebooks.kubespawner``), made with these."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Every user pod: never root, no privilege to gain, no capabilities, the runtime's default seccomp profile and
# no token of the cluster's API (a notebook is hostile).
POD_SECURITY: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
# Zero to JupyterHub's labels: its hub and proxy pods, and the servers it starts.
HUB_POD = {"app": "jupyterhub", "component": "hub"}
PROXY_POD = {"app": "jupyterhub", "component": "proxy"}
SERVER_POD = {"app": "jupyterhub", "component": "singleuser-server"}
DNS_PORT = 53
LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def label_value(value: str) -> str:
    """A Kubernetes label value: at most 63 of letters, digits, '-', '_' and '.', starting and ending with one
    of the first two (our holder "notebook:12" becomes "notebook-12")."""
    return LABEL_VALUE.sub("-", value)[:63].strip("-_.")


def dns_egress() -> dict[str, Any]:
    """A policy's egress rule to the cluster's DNS (kube-dns in kube-system), to find the Services it may reach."""
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}],
    }


def work_volume_claim(
    name: str, namespace: str, size_gib: int, labels: Mapping[str, str], storage_class: str = ""
) -> dict[str, Any]:
    """A person's work folder: one claim per person, kept between sessions (as the Docker volume is)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{size_gib}Gi"}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def network_policy(
    name: str, namespace: str, pods: Mapping[str, str], ingress: list[dict[str, Any]], egress: list[dict[str, Any]]
) -> dict[str, Any]:
    """A NetworkPolicy of both directions for the pods so labelled: only what the rules name is let through."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": dict(pods)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def server_network_policy(namespace: str, hub_port: int, server_port: int = 8888) -> dict[str, Any]:
    """The notebook servers' fence: out, the hub's API alone (and the cluster's DNS to find it); in, the hub
    and its proxy alone, on the server's port. Everything else (other servers, the portal, its database, the
    nodes, the cloud's metadata address) is refused, as the iptables fence refuses it on a Docker host."""
    from_hub = {
        "from": [{"podSelector": {"matchLabels": dict(HUB_POD)}}, {"podSelector": {"matchLabels": dict(PROXY_POD)}}],
        "ports": [{"protocol": "TCP", "port": server_port}],
    }
    to_hub = {"to": [{"podSelector": {"matchLabels": dict(HUB_POD)}}], "ports": [{"protocol": "TCP", "port": hub_port}]}
    return network_policy("gpu-portal-servers", namespace, SERVER_POD, [from_hub], [to_hub, dns_egress()])
