"""The kubelet's gRPC APIs (DRA, plugin registration, device plugin, resource health, gRPC health): stubs protoc
generates from the .proto sources in proto/ (see proto/generate.py)."""
