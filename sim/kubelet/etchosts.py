"""A pod's hostname and its kubelet-managed /etc/hosts, as the kubelet makes them: the hostname is
`spec.hostname`, else the pod's name (at most 63 characters); with `spec.subdomain` the pod also has the name
`<hostname>.<subdomain>.<namespace>.svc.cluster.local`. The hosts file lists localhost, the pod's IP with its
names and the pod's `hostAliases`, and is shared by the pod's containers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.kubelet.volumes import pod_dir

CLUSTER_DOMAIN = "cluster.local"
_HEADER = ("# Kubernetes-managed hosts file.\n"
           "127.0.0.1\tlocalhost\n"
           "::1\tlocalhost ip6-localhost ip6-loopback\n"
           "fe00::0\tip6-localnet\n"
           "fe00::0\tip6-mcastprefix\n"
           "fe00::1\tip6-allnodes\n"
           "fe00::2\tip6-allrouters\n")


def pod_hostname(pod: Mapping[str, Any]) -> str:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    name = str(spec.get("hostname") or meta.get("name") or "")
    return name[:63].rstrip("-.") if len(name) > 63 else name


def hosts_text(pod: Mapping[str, Any], pod_ip: str) -> str:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    hostname = pod_hostname(pod)
    names = [hostname]
    if spec.get("subdomain"):
        names.insert(0, f"{hostname}.{spec['subdomain']}.{meta.get('namespace') or 'default'}.svc.{CLUSTER_DOMAIN}")
    text = _HEADER + f"{pod_ip}\t{chr(9).join(names)}\n"
    aliases = [a for a in spec.get("hostAliases") or [] if isinstance(a, Mapping) and a.get("ip")]
    if aliases:
        text += "\n# Entries added by HostAliases.\n"
        text += "".join(f"{a['ip']}\t{chr(9).join(str(h) for h in a.get('hostnames') or [])}\n" for a in aliases)
    return text


def write_hosts_file(kubelet_dir: Path, pod: Mapping[str, Any], pod_ip: str) -> Path:
    """The pod's etc-hosts file (written once per pod; its containers may edit it, as on a node)."""
    path = pod_dir(kubelet_dir, str((pod.get("metadata") or {}).get("uid") or "")) / "etc-hosts"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".etc-hosts.tmp")
        tmp.write_text(hosts_text(pod, pod_ip))
        tmp.chmod(0o644)
        os.replace(tmp, path)
    return path
