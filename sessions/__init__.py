"""GPUs, slices, notebook sessions, render jobs and their metrics: one Django app per domain inside this package
(``sessions.gpus``, ``sessions.runtime``, ``sessions.metrics``, ``sessions.storage``, ``sessions.notebooks``,
``sessions.render``), each with its models, migrations and admin; this package's own app (label
``gpu_sessions``: Django's ``django.contrib.sessions`` owns ``sessions``) owns no table and wires them together
at start-up (``sessions/apps.py``), with the URLs and the management commands.
"""
