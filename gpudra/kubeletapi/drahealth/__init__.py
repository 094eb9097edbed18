"""Kubelet wire protocol stubs (drahealth)."""
