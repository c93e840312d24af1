package metrics_test

import (
	"bytes"
	"encoding/json"
	"fmt"
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
