package loadgen

import (
	"testing"
	"time"
)

// A waiter polls just after the answer it read refreshes at the edge (made
// at its server_time, kept EdgeRefresh), within 100 ms to a second; an
// answer it saw before, or one without a time, waits the full second.
func TestNextPollFollowsTheEdgeRefresh(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) map[string]any {
		return map[string]any{"server_time": now.Add(d).Format(time.RFC3339Nano)}
	}
	var w waiter
	// Made 700 ms ago: it refreshes in 300 ms, plus up to 200 ms of jitter.
	if got := w.nextPoll(at(-700*time.Millisecond), now); got < 300*time.Millisecond || got >= 500*time.Millisecond {
		t.Errorf("an answer 700 ms old: next poll in %v, want [300ms, 500ms)", got)
	}
	if got := w.nextPoll(at(-700*time.Millisecond), now); got != EdgeRefresh {
		t.Errorf("the same answer again: next poll in %v, want %v", got, EdgeRefresh)
	}
	// Made 3 s ago (a slow edge): at least 100 ms.
	if got := w.nextPoll(at(-3*time.Second), now); got != 100*time.Millisecond {
		t.Errorf("an answer 3 s old: next poll in %v, want 100ms", got)
	}
	// Fresh from the API (no edge): about a second, never more.
	if got := w.nextPoll(at(0), now); got < 900*time.Millisecond || got > EdgeRefresh {
		t.Errorf("a fresh answer: next poll in %v, want [900ms, 1s]", got)
	}
	if got := w.nextPoll(map[string]any{}, now); got != EdgeRefresh {
		t.Errorf("an answer without server_time: next poll in %v, want %v", got, EdgeRefresh)
	}
}
