"""Code shared by the node side (driver) and the cluster side (controller)."""
