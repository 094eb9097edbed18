"""Generated stubs of proto/deviceplugin/v1beta1/api.proto (see proto/generate.py)."""
