"""GPUs and their slices: the MIG catalog, placement rules, GPU backends and the allocator."""
