"""Each domain's settings in a module of its own: GPUs and their hosts, notebook sessions and the hub, render jobs
and their files, billing. portal/settings.py, Django's wiring, imports them all at its end, so Django (and mypy)
still find every setting in portal.settings; base.py holds what they share and none imports portal.settings."""
