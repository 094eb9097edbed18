"""kube-apiserver's audit log: an audit.k8s.io/v1 Policy decides each request's level (policy.py), each request
records one Event through its stages (event.py), and a writer thread appends the events as JSON lines
(backend.py)."""
