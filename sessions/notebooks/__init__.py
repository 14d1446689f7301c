"""JupyterLab sessions on GPU slices: the session record, its lifecycle, the hub and the spawner."""
