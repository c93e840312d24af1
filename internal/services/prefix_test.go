package services

import (
	"bytes"
	"testing"
)

// TestPrefixWriter: apt's lines reach the log as they come, each marked,
// however the writes split them.
func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	w := &prefixWriter{w: &out, prefix: "  apt: "}
	for _, chunk := range []string{"Get:1 redis", "-server\nUnpacking x\nSetting", " up y\n"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	want := "  apt: Get:1 redis-server\n  apt: Unpacking x\n  apt: Setting up y\n"
	if out.String() != want {
		t.Errorf("log = %q, want %q", out.String(), want)
	}
}
