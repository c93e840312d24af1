package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEmulatorLogs: a successful invocation's log reads as a success — the
// runtime's complaint while the emulator is stopped after the answer is
// dropped (before the answer it is kept: then it is a real failure), and the
// REPORT line does not claim a measured memory, and its Init Duration is
// the init phase's that the emulator measured.
func TestEmulatorLogs(t *testing.T) {
	var out bytes.Buffer
	l := &emulatorLogs{w: &out}
	_, _ = l.Write([]byte("[INFO] (rapid) INIT REPORT(durationMs: 7.648000)\n"))
	_, _ = l.Write([]byte("before: failed to get the next invoke: x\nREPORT RequestId: 1\tInit Duration: 0.02 ms\tDuration: 3 ms\tMax Memory"))
	_, _ = l.Write([]byte(" Used: 512 MB\n"))
	l.answered.Store(true)
	_, _ = l.Write([]byte("failed to get the next invoke: read tcp: connection reset by peer\n"))
	l.Flush()
	got := out.String()
	if !strings.Contains(got, "before: failed to get the next invoke") {
		t.Errorf("a failure before the answer was dropped: %q", got)
	}
	if strings.Contains(got, "connection reset by peer") {
		t.Errorf("the emulator's shutdown noise is shown: %q", got)
	}
	if strings.Contains(got, "512 MB") || !strings.Contains(got, "Max Memory Used: not measured by the emulator") {
		t.Errorf("REPORT line = %q, want no configured size passed off as a measurement", got)
	}
	if !strings.Contains(got, "\tInit Duration: 7.65 ms\t") {
		t.Errorf("REPORT line = %q, want the init phase's 7.65 ms that INIT REPORT measured", got)
	}
}
