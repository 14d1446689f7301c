from django.urls import path

from sessions.render import tus, views

urlpatterns = [
    path("", views.job_list, name="render-job-list"),
    path("upload/", views.upload, name="render-job-upload"),
    # The scene itself goes up in parts (tus); portal/entrylimits.py's UPLOAD_PATH is this route's address.
    path("uploads/", tus.create, name="render-upload-create"),
    path("uploads/<slug:token>/", tus.part, name="render-upload-part"),
    path("uploads/<slug:token>/discard/", views.discard_upload, name="render-upload-discard"),
    path("<int:job_id>/", views.job_detail, name="render-job-detail"),
    path("<int:job_id>/main-file/", views.choose_main_file, name="render-job-main-file"),
    path("<int:job_id>/confirm/", views.confirm, name="render-job-confirm"),
    path("<int:job_id>/cancel/", views.cancel, name="render-job-cancel"),
    path("<int:job_id>/requeue-failed/", views.requeue_failed, name="render-job-requeue-failed"),
    path("<int:job_id>/remove-files/", views.remove_files, name="render-job-remove-files"),
    path("<int:job_id>/frames.zip", views.frames_zip, name="render-frames-zip"),
    path("<int:job_id>/frames/<int:number>/", views.frame_download, name="render-frame-download"),
    path("<int:job_id>/frames/<int:number>/thumbnail/", views.frame_thumbnail, name="render-frame-thumbnail"),
]
