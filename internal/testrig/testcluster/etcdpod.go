package testcluster

import "fmt"

// KubeadmEtcdPod is etcd's static-pod manifest as kubeadm writes it for a
// stacked member (cp-1), its --data-dir /var/lib/etcd a hostPath volume of
// hostDataDir.
func KubeadmEtcdPod(hostDataDir string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: etcd, namespace: kube-system}
spec:
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.16-0
    command: [etcd, --data-dir=/var/lib/etcd, --name=cp-1, --initial-cluster=cp-1=https://10.0.0.11:2380, --initial-advertise-peer-urls=https://10.0.0.11:2380]
    volumeMounts: [{name: etcd-data, mountPath: /var/lib/etcd}]
  volumes: [{name: etcd-data, hostPath: {path: %s, type: DirectoryOrCreate}}]
`, hostDataDir)
}
