"""Running containers for slices: the container-runtime adapter."""
