"""KubeSpawner reads a kube-config when it is made (outside a cluster), and the client library takes its path
from KUBECONFIG when it is imported: the tests' own, naming 127.0.0.1, set before anything imports it. The spec
tests never call the API; the lifecycle tests give the in-memory API server's address instead."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

KUBECONFIG = Path(tempfile.mkdtemp(prefix="gpu-portal-kube-")) / "kubeconfig"
KUBECONFIG.write_text(
    yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "tests", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "tests", "user": {"token": "not-a-cluster"}}],
            "contexts": [{"name": "tests", "context": {"cluster": "tests", "user": "tests"}}],
            "current-context": "tests",
        }
    )
)
os.environ["KUBECONFIG"] = str(KUBECONFIG)
