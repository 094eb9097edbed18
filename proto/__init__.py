"""Kubelet wire protocols (.proto sources) and their generated Python stubs."""
