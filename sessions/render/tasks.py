"""Celery tasks of render jobs: thin, idempotent, taking ids and calling the services.

The slices' workers go to the render queue (portal/celery.py routes them), where a chunk may hold its worker
thread for as long as Blender renders; the probe goes to the estimate queue, a lane of its own, so an upload
is estimated whatever renders; dispatch and reconciliation are quick and stay on the default queue.
"""

from __future__ import annotations

from celery import shared_task
from celery.app.task import Task

from sessions.render import chunks, recovery, retention, services, slices, unpacking, uploads
from sessions.render.jobs import remove_orphan_folders

PROBE_RETRY_S = 30
PROBE_RETRIES = 40  # twenty minutes of waiting for a slice, then the job fails and says why


@shared_task
def remove_orphan_uploads() -> int:
    """Hourly: uploads nobody added to for PORTAL_RENDER_UPLOAD_EXPIRY_HOURS go, and what a crash left on disk
    (folders no job or upload owns, long untouched)."""
    return uploads.remove_expired() + remove_orphan_folders()


@shared_task
def unpack_job(job_id: int) -> str:
    """An uploaded scene unpacked and checked, off the request (the default queue: it never waits behind renders)."""
    return str(unpacking.unpack(job_id).state)


@shared_task
def remove_expired_render_files() -> int:
    """Hourly: ended jobs' files go PORTAL_RENDER_RETENTION_DAYS after they ended (records and charges stay), and
    jobs left waiting for their owner PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS are cancelled and lose theirs."""
    return retention.remove_expired_files() + retention.expire_unfinished()


@shared_task(bind=True, max_retries=PROBE_RETRIES)
def estimate_job(self: Task, job_id: int) -> str:
    try:
        return str(services.estimate(job_id).state)
    except services.ProbeWaits as waiting:
        if self.request.retries >= PROBE_RETRIES:
            return str(services.no_slice_for_probe(job_id, str(waiting)).state)
        raise self.retry(countdown=PROBE_RETRY_S) from None


@shared_task
def dispatch_job(job_id: int) -> int:
    return slices.dispatch(job_id)


@shared_task
def work_on_slice(job_id: int, slice_id: int) -> int:
    return chunks.work_on_slice(job_id, slice_id)


@shared_task
def recover_render_work(host: str | None = None) -> dict[str, int]:
    """Sent to a host's render queue by its render worker as it starts (``portal.celery``)."""
    return recovery.recover_after_restart(host)


@shared_task
def recover_estimates() -> dict[str, int]:
    return recovery.restart_probes()


@shared_task
def reconcile_render_jobs() -> dict[str, int]:
    return recovery.reconcile()
