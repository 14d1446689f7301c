"""GPU settings: which backend finds the GPUs (and the simulated fleet where no driver answers), the hosts they
sit in and their agents' heartbeats, the containers slices run in and the engines that run them, and the live
metrics the agents sample. portal/settings.py imports them."""

from __future__ import annotations

import secrets
import socket

from django.core.exceptions import ImproperlyConfigured

from portal.conf.base import DATA_DIR, env
from portal.datafiles import secret_file
from sessions.runtime import engine_config

# GPUs: which backend discovers and slices them, and the simulated fleet used
# where no NVIDIA driver answers.
GPU_BACKEND = env.choice("PORTAL_GPU_BACKEND", "auto", {name: name for name in ("auto", "nvml", "simulated")})
GPU_HOST_NAME = env.text("PORTAL_GPU_HOST_NAME", socket.gethostname())
SIMULATED_FLEET = env.text("PORTAL_SIMULATED_FLEET", "sim-1: 2xH200:mig, 1xA100-80GB:whole, 1xA30:shared=4")
# The hosts of that fleet this machine simulates (its agent beats for them): on a Swarm each GPU host its own
# (compose/swarm-hosts.yaml gives each node's programs its hostname); empty: all of them.
SIMULATED_HOSTS = env.items("PORTAL_SIMULATED_HOSTS", [])
# GPU hosts (sessions/gpus/hosts.py): the machine identity an agent beats with (default: /etc/machine-id, else
# the host name), how often it beats, after how long a silent host is lost (nothing placed there, nothing
# charged past its last heartbeat) and after how much longer its holdings end at that heartbeat.
GPU_NODE_ID = env.text("PORTAL_GPU_NODE_ID", "")
HOST_HEARTBEAT_S = env.integer("PORTAL_HOST_HEARTBEAT_S", 5, minimum=1)
HOST_LOST_AFTER_S = env.integer("PORTAL_HOST_LOST_AFTER_S", 20, minimum=3 * HOST_HEARTBEAT_S)
HOST_GIVE_UP_AFTER_S = env.integer("PORTAL_HOST_GIVE_UP_AFTER_S", 3600, minimum=60)
# How long a launch waits for its host's agent to make its MIG instance (sessions/gpus/orders.py); a host whose
# heartbeat is stale fails it at once.
HOST_ORDER_DEADLINE_S = env.integer("PORTAL_HOST_ORDER_DEADLINE_S", 30, minimum=1)
MAX_SLICES_PER_USER = env.integer("PORTAL_MAX_SLICES_PER_USER", 4, minimum=0)
# GPU containers: host resources per slice, process limit.
CPUS_PER_COMPUTE_SLICE = env.integer("PORTAL_CPUS_PER_COMPUTE_SLICE", 2, minimum=1)
HOST_MEMORY_PER_GPU_GIB = env.integer("PORTAL_HOST_MEMORY_PER_GPU_GIB", 1, minimum=1)
CONTAINER_PIDS_LIMIT = env.integer("PORTAL_CONTAINER_PIDS_LIMIT", 1024, minimum=16)
# A GPU container's output on the host's disk (the engine's json-file log): rotated at this size, this many
# files kept.
CONTAINER_LOG_MAX_BYTES = env.integer("PORTAL_CONTAINER_LOG_MAX_BYTES", 10 * 1024**2, minimum=64 * 1024)
CONTAINER_LOG_FILES = env.integer("PORTAL_CONTAINER_LOG_FILES", 3, minimum=1)
# Labels this portal's containers, so reconciliation never removes another portal's on the same engine.
INSTANCE_ID = env.text("PORTAL_INSTANCE_ID", "") or secret_file(
    DATA_DIR / "instance_id", lambda: secrets.token_hex(6), "PORTAL_INSTANCE_ID"
)

# The Docker engine of each GPU host that is not this machine (sessions/runtime/engines.py): host=endpoint; ...
# A tcp:// engine is reached with TLS both ways: the folder of the CA, the portal's certificate and its key.
DOCKER_TLS_DIR = env.text("PORTAL_DOCKER_TLS_DIR", "")
DOCKER_ENGINES = engine_config.parse(env.text("PORTAL_DOCKER_ENGINES", ""), DOCKER_TLS_DIR)
# A kube:// host's cluster API (sessions/runtime/kube/pods.py): empty, the cluster the portal runs in (its
# service account); else an address such as a kubectl proxy's.
KUBERNETES_API = env.text("PORTAL_KUBERNETES_API", "")
# Whose MIG layout this agent's hosts have (sessions/gpus/fleet.py): "portal", which makes and removes
# instances as slices need them (dynamic MIG), or "cluster", a Kubernetes node whose layout NVIDIA's
# mig-manager applies: the agent then takes the instances it finds as a static layout and changes none.
MIG_LAYOUT = env.choice("PORTAL_MIG_LAYOUT", "portal", {"portal": "portal", "cluster": "cluster"})
# How a render run on a kube:// host asks for its slice (sessions/runtime/kube/jobs.py): the device plugin's
# resources or a DRA claim; and the images its Job runs (as the cluster's nodes pull them).
KUBERNETES_SLICE_REQUEST = env.choice(
    "PORTAL_KUBERNETES_SLICE_REQUEST", "device-plugin", {"device-plugin": "device-plugin", "dra": "dra"}
)
KUBERNETES_PORTAL_IMAGE = env.text("PORTAL_KUBERNETES_PORTAL_IMAGE", "gpu-portal/portal:latest")
KUBERNETES_RENDER_IMAGE = env.text("PORTAL_KUBERNETES_RENDER_IMAGE", "gpu-portal/render:latest")
# Where a slice goes when GPUs of several hosts would serve it (sessions/gpus/packing.py): "pack" fills the
# busiest host first, keeping whole hosts free; "spread" the least busy.
PLACEMENT = env.choice("PORTAL_PLACEMENT", "pack", {"pack": "pack", "spread": "spread"})
# A Swarm manager's Docker endpoint, where the hub's Swarm spawner asks for services and the fleet pages read
# each host's node (sessions/runtime/swarm.py); empty: no Swarm.
SWARM_MANAGER = env.text("PORTAL_SWARM_MANAGER", "")


def _check_fleet() -> None:
    from sessions.gpus.backends.simulated import FleetSpecError, parse_fleet

    try:
        fleet = parse_fleet(SIMULATED_FLEET)
    except FleetSpecError as error:
        raise ImproperlyConfigured(f"PORTAL_SIMULATED_FLEET: {error}") from None
    unknown = sorted(set(SIMULATED_HOSTS) - {gpu.host for gpu in fleet})
    if unknown and GPU_BACKEND == "simulated":  # with NVIDIA's driver (auto, nvml) the setting is not read
        raise ImproperlyConfigured(
            f"PORTAL_SIMULATED_HOSTS names {', '.join(unknown)}, which PORTAL_SIMULATED_FLEET does not have"
        )


_check_fleet()

# Live GPU metrics: how often the agent samples, how long per-minute history is kept, the bearer
# token Prometheus must send to /metrics (empty: /metrics is off), and open metric sockets per person.
METRICS_INTERVAL_MS = env.integer("PORTAL_METRICS_INTERVAL_MS", 1000, minimum=100)
# Where the agent's samples come from: the GPU backend (NVML, or the simulated fleet), or NVIDIA's
# dcgm-exporter on the node (sessions/metrics/dcgm.py), read at its Prometheus address.
METRICS_SOURCE = env.choice("PORTAL_METRICS_SOURCE", "backend", {"backend": "backend", "dcgm": "dcgm"})
DCGM_EXPORTER_URL = env.text("PORTAL_DCGM_EXPORTER_URL", "http://127.0.0.1:9400/metrics")
METRICS_RETENTION_DAYS = env.integer("PORTAL_METRICS_RETENTION_DAYS", 30, minimum=1)
METRICS_TOKEN = env.text("PORTAL_METRICS_TOKEN", "")
METRICS_SOCKETS_PER_USER = env.integer("PORTAL_METRICS_SOCKETS_PER_USER", 20, minimum=1)
