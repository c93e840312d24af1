package metrics_test

// Review 7 of 0700770..HEAD: the EMF line built by hand.

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/metrics"
)

// review7OldLine is what Flush wrote at 0700770 (encoding/json of maps).
func review7OldLine(function, stage string, counts map[string]int, ts time.Time) []byte {
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	defs := make([]map[string]string, len(names))
	line := map[string]any{"Function": function}
	dims := []string{"Function"}
	if stage != "" {
		line["Stage"] = stage
		dims = append(dims, "Stage")
	}
	for i, n := range names {
		defs[i] = map[string]string{"Name": n, "Unit": "Count"}
		line[n] = counts[n]
	}
	line["_aws"] = map[string]any{"Timestamp": ts.UnixMilli(), "CloudWatchMetrics": []any{map[string]any{
		"Namespace": metrics.Namespace, "Dimensions": [][]string{dims}, "Metrics": defs}}}
	b, _ := json.Marshal(line)
	return append(b, '\n')
}

// Held (a differential check): random names, dimensions and counts
// (escapes, U+2028, HTML characters, control characters, extreme and
// negative counts, timestamps before 1970) flushed by one reused recorder
// decode to what the old line decoded to, and each line is valid JSON.
func TestReview7LinesDecodeAsTheOldOnes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	alphabet := []string{"a", "Z", "_", "\"", "\\", "<", ">", "&", "\n", "\x01", "\x7f", "é", "\u2028", "\u2029", "😀", " ", "/"}
	str := func(n int) string {
		var b bytes.Buffer
		for range n {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 300 {
		function, stage := str(1+r.IntN(8)), ""
		if r.IntN(2) == 0 {
			stage = str(1 + r.IntN(8))
		}
		ts := time.UnixMilli(r.Int64N(4e12) - 1e12)
		var buf bytes.Buffer
		rec := metrics.New(&buf, function, stage, func() time.Time { return ts })
		for range 1 + r.IntN(3) { // the recorder's buffers reused between lines
			counts := map[string]int{}
			for range 1 + r.IntN(12) {
				n := str(r.IntN(10))
				if n == "Function" || n == "Stage" || n == "_aws" {
					continue
				}
				c := []int{1, -1, 7, math.MaxInt64, math.MinInt64 + 1, r.IntN(1000) - 500}[r.IntN(6)]
				if c == 0 {
					c = 3
				}
				counts[n] += c
				rec.Count(n, c)
			}
			buf.Reset()
			if err := rec.Flush(); err != nil {
				t.Fatal(err)
			}
			if !json.Valid(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))) || bytes.Count(buf.Bytes(), []byte("\n")) != 1 {
				t.Fatalf("not one JSON line: %q", buf.String())
			}
			var got, want any
			_ = json.Unmarshal(buf.Bytes(), &got)
			_ = json.Unmarshal(review7OldLine(function, stage, counts, ts), &want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("line %q\nold   %q", buf.String(), review7OldLine(function, stage, counts, ts))
			}
		}
	}
}

// failing is a writer that fails every other write and checks it is
// never called by two flushes at once.
type failing struct {
	in  atomic.Int32
	n   atomic.Int64
	mu  sync.Mutex
	out bytes.Buffer
}

func (f *failing) Write(p []byte) (int, error) {
	if f.in.Add(1) != 1 {
		panic("concurrent writes")
	}
	defer f.in.Add(-1)
	if f.n.Add(1)%2 == 0 {
		return 0, errors.New("broken pipe")
	}
	f.mu.Lock()
	f.out.Write(p)
	f.mu.Unlock()
	return len(p), nil
}

// Held: counts and flushes at once with a writer that fails, then works:
// every line is valid JSON, the writes are serialized, and a failed
// write's counts are dropped (as before) while the next line carries only
// what was counted after it.
func TestReview7ConcurrentFlushesWithAFailingWriter(t *testing.T) {
	w := &failing{}
	rec := metrics.New(w, "reserve", "prod", time.Now)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 500 {
				rec.Count("a", 1)
				rec.Count("b\"<", -1)
				if (g+i)%3 == 0 {
					_ = rec.Flush()
				}
			}
		})
	}
	wg.Wait()
	_ = rec.Flush()
	for _, l := range bytes.Split(bytes.TrimSpace(w.out.Bytes()), []byte("\n")) {
		if !json.Valid(l) {
			t.Fatalf("not JSON: %q", l)
		}
	}
}
