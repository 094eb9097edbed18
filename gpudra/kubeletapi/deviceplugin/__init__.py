"""Kubelet wire protocol stubs (deviceplugin)."""
