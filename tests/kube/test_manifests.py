"""The portal's Kubernetes files (compose/kubernetes/) match the API and the code: every object passes the
schema of Kubernetes 1.34 (strict), every image is one we build, every program one the entrypoint runs, every
secret is a placeholder the programs refuse; and Zero to JupyterHub's values name only classes and settings
that exist. No cluster runs here: this proves what the API server would accept and what our code reads, not
that a cluster runs it."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sessions.runtime.kube.jobs import render_network_policy
from tests.conftest import ROOT
from tests.kube.test_specs import KUBERNETES

FOLDER = ROOT / "compose/kubernetes"
MANIFESTS = sorted(path for path in FOLDER.glob("*.yaml") if path.name != "jupyterhub-values.yaml")
ENTRYPOINT = ROOT / "compose/images/portal/entrypoint"


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def pod_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [document["spec"]["template"]["spec"]] if document["kind"] in ("Deployment", "DaemonSet") else []


def check_containers(spec: dict[str, Any], roles: str) -> None:
    """Each container: an image we build, a program the entrypoint runs, no escalation, no capabilities."""
    for container in spec["containers"]:
        name = container["image"].split("/", 1)[1].split(":", 1)[0]
        assert (ROOT / f"compose/images/{name}/Dockerfile").exists(), container["image"]
        assert f"\n    {container['args'][0]})" in roles, container["args"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_every_object_passes_the_apis_schema(path: Path) -> None:
    found = documents(path)
    assert found
    for document in found:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_programs_images_and_secrets_are_ours() -> None:
    objects = [document for path in MANIFESTS for document in documents(path)]
    kinds = {document["kind"] for document in objects}
    assert {"Deployment", "DaemonSet", "Service", "Ingress", "Secret", "ConfigMap"} <= kinds
    roles = ENTRYPOINT.read_text().split('case "$role" in', 1)[1]
    for document in objects:
        for spec in pod_specs(document):
            # Only the programs that call the cluster's API hold the service account's token: the worker's
            # reconciliation, and the estimate and render workers, which make and follow render runs' Jobs.
            callers = {"gpu-portal-worker", "gpu-portal-estimate", "gpu-portal-render"}
            assert spec["automountServiceAccountToken"] is (document["metadata"]["name"] in callers)
            check_containers(spec, roles)
            if document["metadata"]["name"] in {*callers, "gpu-portal-web"}:  # they share the render folder
                (mount,) = spec["containers"][0]["volumeMounts"]
                assert mount == {"name": "render", "mountPath": "/var/lib/portal/render"}
                shared = {"name": "render", "persistentVolumeClaim": {"claimName": "gpu-portal-render"}}
                assert spec["volumes"] == [shared]
    (role,) = [document for document in objects if document["kind"] == "Role"]
    granted = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}  # fmt: skip
    assert granted == {
        ("", "pods"): {"get", "list", "delete"},
        ("", "pods/log"): {"get"},
        ("", "secrets"): {"create", "delete"},
        ("batch", "jobs"): {"create", "get", "list", "patch", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"create", "delete"},
    }, "what the reconciliation and the render runs call (sessions/runtime/kube/pods.py, runs.py), nothing more"
    (claim,) = [document for document in objects if document["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "mounted by pods on any node"
    (secret,) = [document for document in objects if document["kind"] == "Secret"]
    assert set(secret["stringData"].values()) == {"change-me"}  # refused by every program until replaced
    agent = next(document for document in objects if document["kind"] == "DaemonSet")
    assert agent["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    (agent_container,) = agent["spec"]["template"]["spec"]["containers"]
    environment = {item["name"]: item.get("value") for item in agent_container["env"]}
    assert environment["PORTAL_MIG_LAYOUT"] == "cluster", "mig-manager owns the nodes' layouts: the agent stands back"
    (web,) = [document for document in objects if document["metadata"]["name"] == "gpu-portal-web"
              and document["kind"] == "Deployment"]  # fmt: skip
    (port,) = web["spec"]["template"]["spec"]["containers"][0]["ports"]
    (render_policy,) = [document for document in objects if document["kind"] == "NetworkPolicy"]
    assert render_policy == render_network_policy("gpu-portal", port["containerPort"]), "the file is what code makes"
    assert (
        web["spec"]["template"]["metadata"]["labels"]
        == render_policy["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"]
    ), "the render pods reach the web pods: the policy selects them by their labels"


def test_the_hubs_values_name_what_exists() -> None:
    values = yaml.safe_load((FOLDER / "jupyterhub-values.yaml").read_text())
    config = values["hub"]["config"]
    module, _, name = config["JupyterHub"]["spawner_class"].rpartition(".")
    spawner = getattr(importlib.import_module(module), name)
    classes = {
        "JupyterHub": importlib.import_module("jupyterhub.app").JupyterHub,
        "GenericOAuthenticator": importlib.import_module("oauthenticator.generic").GenericOAuthenticator,
        name: spawner,
    }
    assert set(config) == set(classes)
    for section, settings in config.items():
        known = classes[section].class_traits(config=True)
        assert set(settings) - set(known) == set(), section
    assert config[name]["slice_request"] in ("device-plugin", "dra")
    for code in values["hub"]["extraConfig"].values():
        compile(code, "extraConfig", "exec")
    assert values["singleuser"]["image"]["name"] == "gpu-portal/notebook"
    assert values["singleuser"]["networkPolicy"]["enabled"] is True
    assert not any(
        values["singleuser"]["networkPolicy"]["egressAllowRules"].get(rule) for rule in ("privateIPs", "nonPrivateIPs")
    )
