"""Code shared by the node side (driver) and the cluster side (controller)."""

# The default DRA driver name on both sides: NVIDIA's, so that selectors written for NVIDIA's driver carry over.
DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
