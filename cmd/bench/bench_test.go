package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// The parts of make bench that a change to the reserve path or persist
// touches run, briefly, on the real servers, so the benchmark cannot rot
// between runs: each checks its own answers (every accepted answer a 202,
// every sold-out one a 409, every persist decided), and each prints its row.
func TestBenchPartsRun(t *testing.T) {
	testservices.Require(t)
	if err := os.Chdir("../.."); err != nil { // template.yaml, ./cmd/dev
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chdir("cmd/bench") })
	var out bytes.Buffer
	err := run(context.Background(), []string{"-only", "http,cpu,decode,script,lag,buckets,room", "-d", "300ms", "-c", "8", "-room-n", "100", "-room-stock", "10"}, os.Getenv, &out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	for _, row := range []string{"http c=32  accepted (202)", "http c=128 sold out (409)", modeHandlerSDK, modeHandlerDirect, modeHandlerRoom, "reserve handler CPU per accepted reservation = ", "accept → CONFIRMED",
		"reserve, K = 3 on 3 shards", "shards' shares of the CPU", "projected ceiling",
		modeDecodeV1, modeDecodeStrict, "strict decoder on a reserve body",
		"waiting room: reserve attempts per unit sold = ", "waiting room: admissions out of queue order = 0 of", "waiting room: Redis commands / MySQL statements per poll = ",
		"reserve script / bare hold = ", "reserve script / bare hold, K = 3 on a 3-shard Redis Cluster = "} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no %q row in:\n%s", row, out.String())
		}
	}
}
