"""The kubelet plugin: registration service, DRA gRPC (v1 + v1beta1) and the DRA health stream."""
