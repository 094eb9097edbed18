"""Generated stubs of proto/dra/v1/api.proto (see proto/generate.py)."""
