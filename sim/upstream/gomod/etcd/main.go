// etcd for the upstream testbed: Debian's etcd (3.4) is older than Kubernetes 1.37 supports, so it is built from
// the etcd server module at the version Kubernetes itself is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
