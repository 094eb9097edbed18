"""Generated stubs of proto/drahealth/v1alpha1/api.proto (see proto/generate.py)."""
