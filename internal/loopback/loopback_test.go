package loopback

import (
	"fmt"
	"net"
	"testing"
)

// The port is on loopback and can be listened on at once.
func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d", port)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on the port picked: %v", err)
	}
	l.Close()
}
