from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    """The wiring of the domain apps in sessions/ (it owns no table): the registries each fills at start-up."""

    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each kind of workload registers the verbs the rest of the portal acts on it with (sessions/gpus/workloads.py).
        from sessions.gpus import workloads
        from sessions.notebooks.services import release_handing_over
        from sessions.notebooks.workload import Notebooks
        from sessions.render.workload import RenderJobs

        workloads.register(Notebooks())
        workloads.register(RenderJobs())
        # An on-demand notebook launch may wait for a reclaimed spot slice of any kind: every release hands over.
        workloads.register_releaser(release_handing_over)
        # Each part that keeps files measures its own share of everyone's storage quota (sessions/storage/usage.py).
        from sessions.notebooks import storage as notebook_storage
        from sessions.render import storage as render_storage
        from sessions.storage import usage

        usage.register_measure(render_storage.measure_all)
        usage.register_measure(notebook_storage.measure_all)
        # /metrics shows each workload's own figures; the metrics app reads no workload's models.
        from sessions.metrics import prometheus
        from sessions.notebooks.prometheus import NotebookCollector

        prometheus.add_collector(NotebookCollector())
