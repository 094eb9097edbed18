"""Generated stubs of proto/dra/v1beta1/api.proto (see proto/generate.py)."""
