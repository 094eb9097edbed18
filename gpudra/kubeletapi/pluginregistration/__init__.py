"""Kubelet wire protocol stubs (pluginregistration)."""
