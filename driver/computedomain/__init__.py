"""The compute-domain.nvidia.com kubelet plugin side of the node agent (NVIDIA's compute-domain-kubelet-plugin):
IMEX channel and daemon devices in their own ResourceSlice, claims prepared with CDI, and the per-domain IMEX
daemon that a daemon claim starts on its node. See docs/multi-node-nvlink.md."""
