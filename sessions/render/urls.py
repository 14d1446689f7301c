from django.urls import path

from sessions.render import views

urlpatterns = [
    path("", views.job_list, name="render-job-list"),
    path("upload/", views.upload, name="render-job-upload"),
    path("<int:job_id>/", views.job_detail, name="render-job-detail"),
    path("<int:job_id>/main-file/", views.choose_main_file, name="render-job-main-file"),
    path("<int:job_id>/cancel/", views.cancel, name="render-job-cancel"),
]
