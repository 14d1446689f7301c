"""Models of the sessions app: GPUs, slices, notebook sessions, render jobs (filled by later issues)."""
