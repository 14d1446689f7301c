"""Benchmarks: `python -m bench <name>` runs one, `python -m bench all` runs them all.

Each measures its subject against a baseline in the same run (these machines
are noisy), writes bench/results/<name>.json and prints a RESULT line.
"""
