# The spawn benchmark's baseline: stock JupyterHub + stock DockerSpawner, same image, same proxy.
# A user-defined Docker bridge (DockerSpawner's documented set-up), the hub on its gateway; no portal, no SSO.
import os
from pathlib import Path

c = get_config()  # type: ignore[name-defined]  # noqa: F821

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ["BENCH_HUB_DATA"])
c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ['BENCH_PUBLIC_PORT']}/"
c.JupyterHub.hub_bind_url = f"http://{os.environ['BENCH_HUB_IP']}:{os.environ['BENCH_HUB_PORT']}"
c.JupyterHub.hub_connect_url = c.JupyterHub.hub_bind_url
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
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = "gpu-portal/notebook:latest"
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.network_name = os.environ["BENCH_NETWORK"]
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.remove = True
c.DockerSpawner.name_template = "bench-stock-{username}"
# The benchmark removes what carries its run's label, on failure too.
key, _, value = os.environ["BENCH_LABEL"].partition("=")
c.DockerSpawner.extra_create_kwargs = {"labels": {key: value}}
c.DockerSpawner.debug = False
# The same patience as ours (compose/hub/jupyterhub_config.py): on a loaded 2-core machine eight JupyterLabs
# can take over DockerSpawner's default 30 s to answer, and a burst must not fail for stock alone.
c.DockerSpawner.start_timeout = 120
c.DockerSpawner.http_timeout = 60
