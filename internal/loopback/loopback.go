// Package loopback picks free loopback TCP ports for the embedded etcd
// servers started in this process: a snapshot file's private etcd
// (snapshotdb's restore) and the test servers (internal/testrig/testetcd). A port picked is
// free when picked; another process may take it before the server listens,
// which their callers retry.
package loopback

import "net"

// FreePort is a TCP port on 127.0.0.1 that nothing listened on a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
