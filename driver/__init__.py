"""Everything that runs on a node: NVML discovery, slices, the kubelet plugin, prepare, the device plugin shim."""
