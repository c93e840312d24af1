package metrics_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/metrics"
)

func TestFlushWritesOneEMFLine(t *testing.T) {
	var buf bytes.Buffer
	r := metrics.New(&buf, "persist", "", func() time.Time { return time.UnixMilli(1700000000000) })
	r.Count("confirmed", 2)
	r.Count("confirmed", 1)
	r.Count("persist_retries", 4)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var line struct {
		Function  string  `json:"Function"`
		Confirmed float64 `json:"confirmed"`
		Retries   float64 `json:"persist_retries"`
		AWS       struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not JSON: %s", buf.String())
	}
	cw := line.AWS.CloudWatchMetrics
	if line.Function != "persist" || line.Confirmed != 3 || line.Retries != 4 || line.AWS.Timestamp != 1700000000000 ||
		len(cw) != 1 || cw[0].Namespace != "holdfast" || len(cw[0].Metrics) != 2 || cw[0].Dimensions[0][0] != "Function" {
		t.Errorf("EMF line = %s", buf.String())
	}
	buf.Reset()
	if err := r.Flush(); err != nil || buf.Len() != 0 {
		t.Errorf("second Flush wrote %q, want nothing", buf.String())
	}
}

// A deployed stage is a dimension of every metric: two stages in one
// account and region never feed each other's alarms.
func TestStageIsADimension(t *testing.T) {
	var buf bytes.Buffer
	r := metrics.New(&buf, "persist", "prod", time.Now)
	r.Count("item_failures", 1)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var line struct {
		Stage string `json:"Stage"`
		AWS   struct {
			CloudWatchMetrics []struct{ Dimensions [][]string }
		} `json:"_aws"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line.Stage != "prod" || len(line.AWS.CloudWatchMetrics) != 1 ||
		fmt.Sprint(line.AWS.CloudWatchMetrics[0].Dimensions) != "[[Function Stage]]" {
		t.Errorf("EMF line = %s, want dimensions Function and Stage=prod", buf.String())
	}
}

// The hand-built line is the document encoding/json writes for EMF, for
// any name and dimension: with and without a stage, names that need
// escapes, and many names at once.
func TestFlushWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, tc := range []struct {
		function, stage string
		counts          map[string]int
	}{
		{"reserve", "", map[string]int{"accepted": 1}},
		{"persist", "prod", map[string]int{"confirmed": 500, "persist_retries": 2, "item_failures": 1}},
		{"fn \"quoted\"\n", "stage<&>", map[string]int{"a\\b": 3, "é": 4, "\u2028": 5, "\x01": -6}},
	} {
		var buf bytes.Buffer
		r := metrics.New(&buf, tc.function, tc.stage, func() time.Time { return time.UnixMilli(1700000000123) })
		for n, c := range tc.counts {
			r.Count(n, c)
		}
		if err := r.Flush(); err != nil {
			t.Fatal(err)
		}
		if bytes.Count(buf.Bytes(), []byte("\n")) != 1 || !bytes.HasSuffix(buf.Bytes(), []byte("\n")) {
			t.Fatalf("not one line: %q", buf.String())
		}
		// The document as encoding/json writes it from maps.
		names := slices.Sorted(maps.Keys(tc.counts))
		defs := make([]map[string]string, len(names))
		want := map[string]any{"Function": tc.function}
		dims := []string{"Function"}
		if tc.stage != "" {
			want["Stage"] = tc.stage
			dims = append(dims, "Stage")
		}
		for i, n := range names {
			defs[i] = map[string]string{"Name": n, "Unit": "Count"}
			want[n] = tc.counts[n]
		}
		want["_aws"] = map[string]any{"Timestamp": int64(1700000000123), "CloudWatchMetrics": []any{map[string]any{
			"Namespace": metrics.Namespace, "Dimensions": [][]string{dims}, "Metrics": defs}}}
		wantJSON, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var got, wanted any
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("not JSON: %q", buf.String())
		}
		if err := json.Unmarshal(wantJSON, &wanted); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, wanted) {
			t.Errorf("line\n%s\nwant the document\n%s", buf.String(), wantJSON)
		}
	}
}

// Counts from invocations at the same time all reach a line, once.
func TestConcurrentCountsAreFlushedOnce(t *testing.T) {
	var buf bytes.Buffer
	r := metrics.New(&buf, "reserve", "", time.Now)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				r.Count("accepted", 1)
				if err := r.Flush(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var line struct {
			Accepted int `json:"accepted"`
		}
		if err := json.Unmarshal(l, &line); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		total += line.Accepted
	}
	if total != 8000 {
		t.Errorf("the lines count %d, want 8000", total)
	}
}
