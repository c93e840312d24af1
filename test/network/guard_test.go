// Package network_test checks the network guard that make test runs the
// unit tests under (scripts/test.sh): a network namespace where only
// loopback exists, so a test that reaches further fails instead of leaking.
package network_test

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestNetworkGuard: under the guard (HOLDFAST_NETWORK_GUARD=1, set by
// scripts/test.sh inside the namespace) the only interface is loopback, the
// EC2 metadata address is unreachable at once, and loopback works.
func TestNetworkGuard(t *testing.T) {
	if os.Getenv("HOLDFAST_NETWORK_GUARD") != "1" {
		t.Skip("not under the network guard (make test runs the unit tests there)")
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagLoopback == 0 {
			// Stop before dialing anything: this is not the namespace.
			t.Fatalf("interface %s is not loopback: the guard is not in force", i.Name)
		}
	}
	_, err = net.DialTimeout("tcp", "169.254.169.254:80", 2*time.Second)
	if !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("dial the EC2 metadata address = %v, want %v", err, syscall.ENETUNREACH)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial loopback: %v", err)
	}
	_ = c.Close()
}
