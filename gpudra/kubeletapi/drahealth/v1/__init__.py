"""Generated stubs of proto/drahealth/v1/api.proto (see proto/generate.py)."""
