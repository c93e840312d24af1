package services

import (
	"context"
	"net"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A node whose cluster-bus port is taken between its choice and
// redis-server's bind exits; StartCluster starts it again on other ports
// instead of waiting a minute for a server that is gone.
func TestStartClusterSurvivesATakenPort(t *testing.T) {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPorts = func() (int, int, error) {
		picks++
		port, bus, err := freePorts()
		if picks == 1 {
			bus = busy // someone else's by the time redis-server binds it
		}
		return port, bus, err
	}
	t.Cleanup(func() { pickPorts = freePorts })

	ctx := context.Background()
	c, err := StartCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if picks != 4 {
		t.Fatalf("ports chosen %d times, want 4 (the first node twice)", picks)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	defer cc.Close()
	if err := cc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("the cluster does not take a write: %v", err)
	}
}
