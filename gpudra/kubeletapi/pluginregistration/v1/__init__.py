"""Generated stubs of proto/pluginregistration/v1/api.proto (see proto/generate.py)."""
