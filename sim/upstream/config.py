"""The upstream components' configuration and command lines, rendered from the layout (pure: no I/O).

What this sandbox needs beyond a kubeadm node, and why:
- cgroup v1 (hybrid): the kubelet refuses cgroup v1 unless `failCgroupV1: false` (accepted through 1.37).
- no CAP_SYS_RESOURCE: the kubelet may not lower its own OOM score (`oomScoreAdj` left at the current 0) nor raise
  its open-files limit past the hard limit (`maxOpenFiles`), and containerd must not lower containers' scores
  (`restrict_oom_score_adj`).
- one machine, several nodes: each kubelet has its own cgroup root, address and mount namespace.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.upstream.layout import (
    API_ADDRESS,
    API_PORT,
    CLUSTER_DOMAIN,
    POD_CIDR,
    SERVICE_CIDR,
    ClusterLayout,
    NodePlan,
)

# kube-apiserver flags whose defaults differ from what a kubeadm cluster sets, plus what one machine needs.
_ADMISSION = "NodeRestriction"


def etcd_argv(bin_dir: Path, layout: ClusterLayout) -> list[str]:
    return [str(bin_dir / "etcd"), "--name=etcd", f"--data-dir={layout.etcd_data}",
            "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=etcd=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
            "--quota-backend-bytes=2147483648", "--log-level=warn"]


def apiserver_argv(bin_dir: Path, layout: ClusterLayout) -> list[str]:
    pki = layout.pki
    return [str(bin_dir / "kube-apiserver"),
            f"--advertise-address={API_ADDRESS}", "--bind-address=0.0.0.0", f"--secure-port={API_PORT}",
            "--etcd-servers=http://127.0.0.1:2379",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", f"--enable-admission-plugins={_ADMISSION}",
            "--allow-privileged=true", "--anonymous-auth=true", "--profiling=false",
            f"--audit-log-path={layout.logs / 'audit.log'}", "--audit-log-maxsize=100",
            f"--audit-policy-file={layout.state / 'audit-policy.yaml'}",
            "--v=1"]


AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "rules": [{"level": "None", "verbs": ["get", "list", "watch"]},
                          {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
                          {"level": "Metadata"}]}


def controller_manager_argv(bin_dir: Path, layout: ClusterLayout) -> list[str]:
    kubeconfig = layout.kubeconfig("controller-manager")
    pki = layout.pki
    return [str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", "--secure-port=10257", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", f"--cluster-cidr={POD_CIDR}", "--leader-elect=false",
            "--v=1"]


def scheduler_argv(bin_dir: Path, layout: ClusterLayout) -> list[str]:
    kubeconfig = layout.kubeconfig("scheduler")
    return [str(bin_dir / "kube-scheduler"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false", "--v=1"]


def kube_proxy_config(layout: ClusterLayout, node: NodePlan) -> dict[str, object]:
    return {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "nftables", "clusterCIDR": POD_CIDR, "hostnameOverride": node.name,
            "clientConnection": {"kubeconfig": str(layout.kubeconfig("kube-proxy"))},
            "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
            # conntrack sysctls are the machine's; the proxy must not try to raise them.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"}}


def kube_proxy_argv(bin_dir: Path, config: Path) -> list[str]:
    return [str(bin_dir / "kube-proxy"), f"--config={config}", "--v=1"]


def kubelet_config(layout: ClusterLayout, node: NodePlan, cert: Path, key: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(layout.pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "address": node.address, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": node.address, "healthzPort": 10248,
        "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root(layout, node), "failCgroupV1": False,
        "failSwapOn": False, "oomScoreAdj": 0, "maxOpenFiles": 10000,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "clusterDomain": CLUSTER_DOMAIN, "resolvConf": "/etc/resolv.conf",
        "staticPodPath": "", "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        # The machine's disk is shared by every node; eviction on a nearly full disk would hit them all at once.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "podPidsLimit": 4096, "protectKernelDefaults": False, "makeIPTablesUtilChains": False,
        "shutdownGracePeriod": "0s", "nodeStatusReportFrequency": "10s",
    }


def kubelet_argv(bin_dir: Path, layout: ClusterLayout, node: NodePlan, config: Path, labels: dict[str, str]) -> list[str]:
    label_arg = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return [str(bin_dir / "kubelet"), f"--config={config}",
            f"--kubeconfig={layout.kubeconfig('kubelet-' + node.name)}", f"--hostname-override={node.name}",
            f"--node-ip={node.address}", f"--node-labels={label_arg}", "--v=1"]


def cgroup_root(layout: ClusterLayout, node: NodePlan) -> str:
    return f"/gpu-dra.{layout.name}.{node.name}"


def containerd_config(cni_bin: Path, runc: str) -> str:
    """containerd 2.x (config version 3): CDI on (its default), runc from the distribution, CNI from our build."""
    return "\n".join([
        "version = 3",
        "root = '/var/lib/containerd'",
        "state = '/run/containerd'",
        "[grpc]",
        "  address = '/run/containerd/containerd.sock'",
        "[plugins.'io.containerd.cri.v1.runtime']",
        "  enable_cdi = true",
        "  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']",
        "  restrict_oom_score_adj = true",
        "  tolerate_missing_hugetlb_controller = true",
        "  disable_hugetlb_controller = true",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
        f"  BinaryName = '{runc}'",
        "  SystemdCgroup = false",
        "[plugins.'io.containerd.cri.v1.runtime'.cni]",
        f"  bin_dirs = ['{cni_bin}']",
        "  conf_dir = '/etc/cni/net.d'",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "",
    ])


def cni_config(node: NodePlan) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "gpu-dra", "plugins": [
            {"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_subnet, "gateway": node.pod_gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ]}, indent=2)
