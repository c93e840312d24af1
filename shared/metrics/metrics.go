// Package metrics writes CloudWatch Embedded Metric Format (EMF) lines to
// stdout: CloudWatch Logs turns them into metrics, with no client and no API
// call on the request path.
package metrics

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of every holdfast metric.
const Namespace = "holdfast"

// Recorder accumulates counts and writes them as one EMF line per Flush.
// It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	w      io.Writer
	dims   []byte // the line's dimension members: "Function":…[,"Stage":…]
	names  []byte // the EMF Dimensions set: ["Function"[,"Stage"]]
	now    func() time.Time
	counts map[string]int
	// Flush's scratch, kept between lines (a line on every invocation).
	sorted []string
	line   []byte
}

// New returns a Recorder that writes to w with the dimensions
// Function=function and, when stage is not empty, Stage=stage: two stages
// in one account and region must not share an alarm's metric.
func New(w io.Writer, function, stage string, now func() time.Time) *Recorder {
	r := &Recorder{w: w, now: now, counts: map[string]int{}}
	r.dims = appendString(append(r.dims, `"Function":`...), function)
	r.names = append(r.names, `["Function"`...)
	if stage != "" {
		r.dims = appendString(append(r.dims, `,"Stage":`...), stage)
		r.names = append(r.names, `,"Stage"`...)
	}
	r.names = append(r.names, ']')
	return r
}

// Count adds n to the named counter (reservation.Metrics). A name is not
// a dimension's ("Function", "Stage") nor "_aws": it is a member of the
// same JSON object.
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
// The line is what encoding/json writes for EMF's document, built by hand:
// it is written after every invocation, and a map's marshalling was a
// twentieth of the reserve function's CPU (docs/benchmarks.md).
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.counts) == 0 {
		return nil
	}
	r.sorted = r.sorted[:0]
	for n := range r.counts {
		r.sorted = append(r.sorted, n)
	}
	slices.Sort(r.sorted)
	b := append(r.line[:0], `{"_aws":{"Timestamp":`...)
	b = strconv.AppendInt(b, r.now().UnixMilli(), 10)
	b = append(b, `,"CloudWatchMetrics":[{"Namespace":"`+Namespace+`","Dimensions":[`...)
	b = append(b, r.names...)
	b = append(b, `],"Metrics":[`...)
	for i, n := range r.sorted {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(append(b, `{"Name":`...), n)
		b = append(b, `,"Unit":"Count"}`...)
	}
	b = append(b, `]}]},`...)
	b = append(b, r.dims...)
	for _, n := range r.sorted {
		b = appendString(append(b, ','), n)
		b = strconv.AppendInt(append(b, ':'), int64(r.counts[n]), 10)
	}
	b = append(b, "}\n"...)
	r.line = b
	clear(r.counts)
	_, err := r.w.Write(b)
	return err
}

// appendString appends s as a JSON string: as it is, quoted, when it
// needs no escape (every name and dimension holdfast has), and as
// encoding/json writes it otherwise.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
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
