# The spawn benchmark's baseline: stock JupyterHub + stock DockerSpawner, same image, same proxy.
# Host network, each server on a free port of its own; no portal, no SSO.
import os
from pathlib import Path

c = get_config()  # type: ignore[name-defined]  # noqa: F821

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ["BENCH_HUB_DATA"])
c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ['BENCH_PUBLIC_PORT']}/"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ['BENCH_HUB_PORT']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['BENCH_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [str(ROOT / "compose/hub/node_modules/.bin/configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "cookie_secret")
c.JupyterHub.pid_file = str(DATA / "jupyterhub.pid")
c.JupyterHub.authenticator_class = "null"
c.JupyterHub.services = [{"name": "bench", "api_token": os.environ["BENCH_TOKEN"]}]
c.JupyterHub.load_roles = [
    {"name": "bench", "scopes": ["admin:users", "servers"], "services": ["bench"]},
]
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
from dockerspawner import DockerSpawner  # noqa: E402
from jupyterhub.utils import random_port  # noqa: E402


class HostNetworkDockerSpawner(DockerSpawner):  # type: ignore[misc]
    """DockerSpawner as its documentation says to run it on the host network: its own address and port
    (a free one per server, so several can run at once); nothing more."""

    async def start(self):  # type: ignore[no-untyped-def]
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):  # type: ignore[no-untyped-def]
        return self.host_ip, self.port


c.JupyterHub.spawner_class = HostNetworkDockerSpawner
c.DockerSpawner.host_ip = "127.0.0.1"
c.DockerSpawner.image = "gpu-portal/notebook:latest"
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.network_name = "host"
c.DockerSpawner.ip = "127.0.0.1"
c.DockerSpawner.extra_host_config = {"port_bindings": None}
c.DockerSpawner.remove = True
c.DockerSpawner.name_template = "bench-stock-{username}"
c.DockerSpawner.debug = False
