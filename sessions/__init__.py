"""GPUs, slices, notebook sessions, render jobs and their metrics.

Its app label is ``gpu_sessions``: Django's own ``django.contrib.sessions``
already owns the label ``sessions``.
"""
