"""`gpu-dra cluster`: a live simulated GPU cluster that stays up (supervisor, state, kubeconfig, status)."""
