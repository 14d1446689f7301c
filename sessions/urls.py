from django.urls import path

from sessions import views

urlpatterns = [
    path("", views.session_list, name="session-list"),
    path("render-jobs/", views.render_job_list, name="render-job-list"),
    path("fleet/", views.fleet, name="fleet"),
]
