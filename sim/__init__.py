"""The testbed: what lets gpu-dra run without a cluster or a GPU (NVML simulator, kubelet simulators, the demo).

Nothing here ships to a real node's code path: product packages never import it, except `driver.nvml`'s one seam
that loads the NVML simulator for `--nvml sim:...`.
"""
