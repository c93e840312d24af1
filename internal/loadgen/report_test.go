package loadgen

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestRound(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{28770354 * time.Nanosecond, 28800 * time.Microsecond},
		{412345 * time.Nanosecond, 412 * time.Microsecond},
		{1523456789 * time.Nanosecond, 1520 * time.Millisecond},
		{123456789 * time.Nanosecond, 123 * time.Millisecond},
		{2345678 * time.Nanosecond, 2350 * time.Microsecond},
	} {
		if got := Round(c.in); got != c.want {
			t.Errorf("Round(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestReportPrint: the latency lines read as a person reads them.
func TestReportPrint(t *testing.T) {
	r := &Report{Latency: Percentiles{P50: 28770354 * time.Nanosecond}}
	var b bytes.Buffer
	r.Print(&b)
	if !strings.Contains(b.String(), "p50 28.8ms") {
		t.Errorf("report prints %q, want p50 28.8ms", b.String())
	}
}

// TestP99Segments: an interval where no request started is a gap in the
// p99 line, never a 0 ms point.
func TestP99Segments(t *testing.T) {
	ms := time.Millisecond
	tl := []Bucket{
		{At: 0, Requests: 3, P99: 5 * ms}, {At: 10 * ms, Requests: 1, P99: 7 * ms},
		{At: 20 * ms},
		{At: 30 * ms, Requests: 2, P99: 9 * ms},
	}
	segs := P99Segments(tl)
	if len(segs) != 2 || len(segs[0]) != 2 || len(segs[1]) != 1 {
		t.Fatalf("P99Segments = %v, want two segments split at the empty bucket", segs)
	}
	for _, s := range segs {
		for _, p := range s {
			if p.Y == 0 {
				t.Errorf("a 0 ms point at %v s", p.X)
			}
		}
	}
}

// TestTimelineCountsSoldOut: the chart's sold-out line has its data.
func TestTimelineCountsSoldOut(t *testing.T) {
	start := time.Now()
	outs := []outcome{{start: start, status: 202}, {start: start, status: 409, code: "sold_out"}, {start: start, status: 409, code: "sold_out"}}
	tl := timeline(outs, start)
	if tl[0].Accepted != 1 || tl[0].SoldOut != 2 || tl[0].Requests != 3 {
		t.Errorf("bucket = %+v, want 3 requests: 1 accepted, 2 sold out", tl[0])
	}
}

// TestProgressUnit: the minting bar counts tokens, not requests.
func TestProgressUnit(t *testing.T) {
	var b bytes.Buffer
	progressLine(&b, "tokens ", 5, 10, time.Now().Add(-time.Second))
	if !strings.Contains(b.String(), "tokens/s") || strings.Contains(b.String(), "req/s") {
		t.Errorf("progress line %q, want a rate in tokens/s", b.String())
	}
}

func TestWriteChart(t *testing.T) {
	ms := time.Millisecond
	r := &Report{Timeline: []Bucket{{At: 0, Width: 10 * ms, Requests: 3, Accepted: 2, SoldOut: 1, P99: 5 * ms}, {At: 10 * ms, Width: 10 * ms}},
		lags: []time.Duration{80 * ms, 120 * ms}}
	path := t.TempDir() + "/load.png"
	if err := WriteChart(r, path); err != nil {
		t.Fatalf("WriteChart: %v", err)
	}
}

// TestReportShowsTheWindow: with a sale that opened late, the report names
// the not_open answers before it and the accepted ones of its first second,
// and an answer accepted before it opened fails a check.
func TestReportShowsTheWindow(t *testing.T) {
	r := &Report{OpensAt: time.Now(), Opened: 3 * time.Second, NotOpen: 64, FirstSecond: 912}
	r.Checks = checks(r)
	var b bytes.Buffer
	r.Print(&b)
	if !strings.Contains(b.String(), "opened 3s after the start: 64 not_open answers before it; 912 accepted/s in its first second") ||
		!strings.Contains(b.String(), "PASS  nothing sold before the sale opened") {
		t.Errorf("report prints %q, want the window line and a passing window check", b.String())
	}
	r.EarlyAccepted = 1
	if r.Checks = checks(r); r.Passed() {
		t.Error("a reservation accepted before the sale opened passed the checks")
	}
}
