"""kube-scheduler's and kube-controller-manager's work, as the controller plays it on the embedded control plane
(`gpu-dra controller --embedded`): placement and binding with preemption and quotas, claims from templates and
for pod groups, reservation cleanup, device taint eviction. On a real cluster those components do all of it, so
none of this ships in the image; the controller reaches it only through controller.manager.ClusterRoles.

Frozen as the other stand-ins: defects are fixed, no new Kubernetes behaviour goes in (the upstream backend,
`gpu-dra cluster up --kubernetes upstream`, proves new behaviour against the real components).
"""
