"""Kubelet wire protocol stubs (dra)."""
