// Package metrics writes CloudWatch Embedded Metric Format (EMF) lines to
// stdout: CloudWatch Logs turns them into metrics, with no client and no API
// call on the request path.
package metrics

import (
	"context"
	"encoding/json"
	"io"
	"sort"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of every holdfast metric.
const Namespace = "holdfast"

// Recorder accumulates counts and writes them as one EMF line per Flush.
// It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	w        io.Writer
	function string
	stage    string
	now      func() time.Time
	counts   map[string]int
}

// New returns a Recorder that writes to w with the dimensions
// Function=function and, when stage is not empty, Stage=stage: two stages
// in one account and region must not share an alarm's metric.
func New(w io.Writer, function, stage string, now func() time.Time) *Recorder {
	return &Recorder{w: w, function: function, stage: stage, now: now, counts: map[string]int{}}
}

// Count adds n to the named counter (reservation.Metrics).
func (r *Recorder) Count(name string, n int) {
	if n == 0 {
		return
	}
	r.mu.Lock()
	r.counts[name] += n
	r.mu.Unlock()
}

// Flush writes one EMF line with every counter recorded since the last
// Flush, and resets them. Nothing is written when nothing was counted.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	counts := r.counts
	r.counts = map[string]int{}
	r.mu.Unlock()
	if len(counts) == 0 {
		return nil
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	defs := make([]map[string]string, len(names))
	line := map[string]any{"Function": r.function}
	dims := []string{"Function"}
	if r.stage != "" {
		line["Stage"] = r.stage
		dims = append(dims, "Stage")
	}
	for i, n := range names {
		defs[i] = map[string]string{"Name": n, "Unit": "Count"}
		line[n] = counts[n]
	}
	line["_aws"] = map[string]any{
		"Timestamp": r.now().UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace": Namespace, "Dimensions": [][]string{dims}, "Metrics": defs,
		}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.w.Write(b)
	return err
}

// Flushing wraps a Lambda handler so that the counts of each invocation are
// written when it returns.
func Flushing[In, Out any](r *Recorder, h func(context.Context, In) (Out, error)) func(context.Context, In) (Out, error) {
	return func(ctx context.Context, in In) (Out, error) {
		out, err := h(ctx, in)
		_ = r.Flush() // stdout; nothing to do if it fails
		return out, err
	}
}
