"""The REST handlers behind the filter chain (controlplane.handler authenticates, authorizes and admits), as
k8s.io/apiserver/pkg/endpoints/handlers divides them: reads (get, list; watch is controlplane.watchserve), writes
(create, update, patch, delete), subresources (log, exec, scale, binding, and the reviews and TokenRequest that
answer without storing) and discovery. Each takes the request's handler: its headers, body and responses."""
