"""Authorization, the second stage of the chain: may this user do this (kube-apiserver's
`--authorization-mode=Node,RBAC`, behind the system:masters short-circuit every kube-apiserver has)."""
