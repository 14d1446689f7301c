"""Render jobs' settings: their queues and the render worker's threads, where workers get scenes and give frames
back (this machine's disk or the portal's file store), what a job and an upload may be, how long files are kept,
and each person's storage quota on the portal's disk, which render jobs' files fill most. portal/settings.py
imports them (and lets the file store's address through ALLOWED_HOSTS)."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from portal.conf.base import DATA_DIR, env
from portal.datafiles import secret_file

# Render jobs' own queue (portal/celery.py routes the probe and the slices' workers there); empty: the
# default queue's name plus "-render", so a test run's or a second portal's queues stay apart.
RENDER_QUEUE = env.text("PORTAL_RENDER_QUEUE", "")
# Threads of the render worker (make run's supervisor starts it with as many): each follows one slice's chunks,
# and every person rendering gets an equal share of them (sessions/render/services.py, share_of_threads).
RENDER_THREADS = env.integer("PORTAL_RENDER_CONCURRENCY", os.cpu_count() or 1, minimum=1)
# Where render workers get a job's scene and give its frames back (sessions/render/filestore.py): "local", this
# machine's PORTAL_RENDER_DIR, or "portal", a GPU host's worker that does not share the portal's disk: it fetches
# from the portal at PORTAL_FILE_STORE_URL into PORTAL_RENDER_SCRATCH_DIR, each call signed with
# PORTAL_FILE_STORE_KEY, which the portal and its GPU hosts share (sessions/render/portalstore.py).
RENDER_FILE_STORE = env.choice("PORTAL_RENDER_FILE_STORE", "local", {"local": "local", "portal": "portal"})
FILE_STORE_URL = env.text("PORTAL_FILE_STORE_URL", "")
# The hosts whose render queues this machine's render worker reads (sessions/render/queues.py); empty: its GPU
# agent's hosts, and with simulated GPUs every simulated host whose engine is this machine's.
RENDER_HOSTS = env.items("PORTAL_RENDER_HOSTS", [])
# A host whose render queue no running worker has read for this long, while chunks render there, lost its render
# worker (killed, or its machine cut off): reconciliation puts those chunks back for the other hosts' workers.
RENDER_WORKER_SILENCE_S = env.integer("PORTAL_RENDER_WORKER_SILENCE_S", 60, minimum=0)
# Estimates' own queue (the probe), read by a worker of its own, so an upload is estimated while renders hold
# every render thread; empty: the default queue's name plus "-estimate".
ESTIMATE_QUEUE = env.text("PORTAL_ESTIMATE_QUEUE", "")

# Rendering: how often a failed chunk is tried in all, how long one chunk's or the probe's container may
# run, and the thumbnails' longest side in pixels.
RENDER_CHUNK_ATTEMPTS = env.integer("PORTAL_RENDER_CHUNK_ATTEMPTS", 3, minimum=1)
RENDER_CHUNK_WALL_SECONDS = env.integer("PORTAL_RENDER_CHUNK_WALL_SECONDS", 3600, minimum=10)
RENDER_PROBE_WALL_SECONDS = env.integer("PORTAL_RENDER_PROBE_WALL_SECONDS", 600, minimum=10)
# The estimate's probe renders a few of the job's frames as the job will; this bounds their sampling in all
# (shared among them, each frame stopped at its share, its samples left projected at the pace of those taken).
RENDER_PROBE_SAMPLING_SECONDS = env.integer("PORTAL_RENDER_PROBE_SAMPLING_SECONDS", 30, minimum=1)
RENDER_THUMBNAIL_PIXELS = env.integer("PORTAL_RENDER_THUMBNAIL_PIXELS", 320, minimum=16)
# The widest or tallest frame a job may render, in pixels (the scene's resolution at the job's percentage):
# a scene past it fails its estimate, and no frame larger is ever decoded for a thumbnail.
RENDER_MAX_RESOLUTION = env.integer("PORTAL_RENDER_MAX_RESOLUTION", 16384, minimum=16)
# What one chunk's run (or the probe) may write into its output folder, a host folder the sandbox writes:
# past it the container is stopped and the job fails, so a hostile scene cannot fill the host's disk.
RENDER_MAX_OUTPUT_BYTES = env.integer("PORTAL_RENDER_MAX_OUTPUT_BYTES", 20 * 1024**3, minimum=1024**2)

# Render jobs: where scenes and frames live (a folder per person, named by a keyed hash, and per job, named
# at random), and what an upload may be. The upload limit holds while the body streams to disk.
RENDER_DIR = env.path("PORTAL_RENDER_DIR", DATA_DIR / "render")
RENDER_SCRATCH_DIR = env.path("PORTAL_RENDER_SCRATCH_DIR", DATA_DIR / "render-scratch")


def _file_store_key() -> str:
    """PORTAL_FILE_STORE_KEY; on the portal's machine alone, else a key generated once into the data directory
    (a GPU host's worker must be given the portal's: it refuses to start without it)."""
    given = env.text("PORTAL_FILE_STORE_KEY", "")
    if given and len(given) < 32:
        raise ImproperlyConfigured("PORTAL_FILE_STORE_KEY must be at least 32 characters long.")
    if RENDER_FILE_STORE == "portal" and not (given and FILE_STORE_URL):
        raise ImproperlyConfigured(
            "PORTAL_RENDER_FILE_STORE=portal needs PORTAL_FILE_STORE_URL (the portal's address as this host reaches "
            "it) and PORTAL_FILE_STORE_KEY (the portal's own key)."
        )
    return given or secret_file(DATA_DIR / "file_store_key", variable="PORTAL_FILE_STORE_KEY")


FILE_STORE_KEY = _file_store_key()
RENDER_MAX_UPLOAD_BYTES = env.integer("PORTAL_RENDER_MAX_UPLOAD_BYTES", 2 * 1024**3, minimum=1024)
RENDER_MAX_UNPACKED_BYTES = env.integer("PORTAL_RENDER_MAX_UNPACKED_BYTES", 8 * 1024**3, minimum=1024)
RENDER_MAX_ZIP_ENTRIES = env.integer("PORTAL_RENDER_MAX_ZIP_ENTRIES", 5000, minimum=1)
RENDER_MAX_FRAMES = env.integer("PORTAL_RENDER_MAX_FRAMES", 10000, minimum=1)
# A zip whose entries (any over 1 MiB, and all together) unpack to more than this many times what they take
# packed is refused from its directory, before anything is unpacked.
RENDER_MAX_COMPRESSION_RATIO = env.integer("PORTAL_RENDER_MAX_COMPRESSION_RATIO", 100, minimum=2)
# Per person: render jobs not yet ended (uploads on their way count), and how long an upload nobody adds to is kept
# before it is removed. The uploads each may begin in a window are the public entry's, in portal/settings.py.
RENDER_MAX_OPEN_JOBS = env.integer("PORTAL_RENDER_MAX_OPEN_JOBS", 10, minimum=1)
RENDER_UPLOAD_EXPIRY_HOURS = env.integer("PORTAL_RENDER_UPLOAD_EXPIRY_HOURS", 24, minimum=1)
# Days an ended job keeps its files (scene, frames, thumbnails); an hourly task then removes them, keeping
# the job's record and every charge.
RENDER_RETENTION_DAYS = env.integer("PORTAL_RENDER_RETENTION_DAYS", 30, minimum=1)
# A job left waiting for its owner (its main file never chosen, its estimate never confirmed) is cancelled this
# many hours after it began to wait, and its files removed, by the hourly retention task.
RENDER_UNFINISHED_EXPIRY_HOURS = env.integer("PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS", 48, minimum=1)

# Storage: what one person may keep on the portal's disk (render jobs' files, uploads on their way, the notebook
# work volume, notebook containers' own files) unless a group of theirs or they themselves have a quota set in
# the admin; and how often a periodic task measures it all again (each job is also measured as its files change).
STORAGE_QUOTA_BYTES = env.integer("PORTAL_STORAGE_QUOTA_BYTES", 50 * 1024**3, minimum=1024**2)
STORAGE_MEASURE_MINUTES = env.integer("PORTAL_STORAGE_MEASURE_MINUTES", 10, minimum=1)
