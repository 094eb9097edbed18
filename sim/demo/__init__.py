"""`gpu-dra demo`: the end-to-end run on an embedded control plane with simulated GPU nodes (see runner.py)."""
