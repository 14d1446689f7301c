"""URL map: login and account pages, dashboard, each app's pages, the admin."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from portal import views
from sessions.metrics.prometheus import metrics_view
from sessions.render import internal as render_store

admin.site.site_header = f"{settings.SITE_NAME} administration"
admin.site.site_title = settings.SITE_NAME

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("healthz", views.healthz, name="healthz"),
    # For Prometheus: bearer token only, no login (off while PORTAL_METRICS_TOKEN is empty).
    path("metrics", metrics_view, name="metrics"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path(
        "accounts/password_reset/",
        auth_views.PasswordResetView.as_view(extra_email_context={"site_name": settings.SITE_NAME}),
        name="password_reset",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("sessions/", include("sessions.urls")),
    path("billing/", include("billing.urls")),
    path("internal/notebooks/", include("sessions.notebooks.urls")),
    # GPU hosts' render workers: scenes out, frames in, each call signed for its job (sessions/render/portalstore.py).
    path("internal/render/jobs/<int:job_id>/scene/", render_store.scene, name="render-store-scene"),
    path("internal/render/jobs/<int:job_id>/scene/<path:path>", render_store.scene_file, name="render-store-file"),
    path("internal/render/jobs/<int:job_id>/output/<path:path>", render_store.output, name="render-store-output"),
    path("internal/render/jobs/<int:job_id>/measure/", render_store.measure, name="render-store-measure"),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("admin/", admin.site.urls),
    # A notebook server the proxy has no route for (not started yet, or stopped): the proxy sends its
    # paths here, its default target. Hand them to the hub, as a stock proxy would, whose "not running"
    # page points back to the Sessions page; cheap, since JupyterLab tabs keep retrying.
    re_path(r"^jupyter/user/(?P<rest>.*)$", views.hub_user_path, name="hub-user-path"),
]
