"""The portal on Kubernetes (issue 34): what a slice the allocator chose becomes in the cluster's words.

``slices``: the two ways to ask Kubernetes for a slice, from the allocator's decision: the NVIDIA device
plugin's extended resources (``nvidia.com/mig-<profile>``, ``nvidia.com/gpu``, the time-slicing replicas'
``nvidia.com/gpu.shared``) with node affinity to the chosen node, or a Dynamic Resource Allocation claim
(``resource.k8s.io/v1``) that names the very device. ``manifests``: the objects beside a notebook server's pod
(work volume, network policy) and the hardening of every user pod; ``jobs``: a render chunk's run as a Job.
Plain dictionaries in the API's own shape, no Django and no client (an import contract holds them to it): the
hub's spawner (a KubeSpawner), the portal and the tests use them alike, and the tests check each against the
API's OpenAPI schema. ``pods``: the portal's side, a namespace's notebook pods as reconciliation follows them.
"""
