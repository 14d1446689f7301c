"""The multi-host lab: see tests/lab/lab.py."""
