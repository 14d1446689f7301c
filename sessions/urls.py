from django.urls import include, path
from django.views.generic import RedirectView

from sessions.gpus import views as gpu_views
from sessions.metrics import views as metric_views
from sessions.notebooks import views as notebook_views

urlpatterns = [
    path("", notebook_views.session_list, name="session-list"),
    path("launch/", notebook_views.launch, name="session-launch"),
    path("all/", notebook_views.all_sessions, name="session-all"),
    path("<int:session_id>/", notebook_views.session_detail, name="session-detail"),
    path("<int:session_id>/stop/", notebook_views.stop, name="session-stop"),
    path("render-jobs/", include("sessions.render.urls")),
    path("render/", RedirectView.as_view(pattern_name="render-job-list"), name="render"),
    path("fleet/", gpu_views.fleet_overview, name="fleet"),
    path("fleet/live/", metric_views.fleet_live, name="fleet-live"),
    path("fleet/live.json", metric_views.fleet_latest, name="fleet-latest"),
    path("fleet/hosts/<int:host_id>/drain/", gpu_views.fleet_host_drain, name="fleet-host-drain"),
    path("fleet/gpus/<int:gpu_id>/", gpu_views.fleet_gpu, name="fleet-gpu"),
    path("fleet/gpus/<int:gpu_id>/policy/", gpu_views.fleet_gpu_policy, name="fleet-gpu-policy"),
    path("fleet/gpus/<int:gpu_id>/layout/", gpu_views.fleet_gpu_layout, name="fleet-gpu-layout"),
    path("fleet/gpus/<int:gpu_id>/sharing/", gpu_views.fleet_gpu_sharing, name="fleet-gpu-sharing"),
]
