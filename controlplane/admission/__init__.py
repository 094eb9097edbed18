"""Admission, the third stage of the chain: kube-apiserver's validating admission plugins that matter here
(NodeRestriction, the DRA rules of the resource.k8s.io strategies, Pod validation, ValidatingAdmissionPolicy,
ValidatingAdmissionWebhook), run on the object a write would store, after the strategy's own validation."""
