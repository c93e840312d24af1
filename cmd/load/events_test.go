package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEventsQueueIsFoundAsMakeDevFindsIt: against make dev (a loopback
// API), the events check reads the queue make dev publishes to —
// HOLDFAST_EVENTS_QUEUE_URL, else the services' env file scripts/dev.sh
// loads it from; -events-queue names another or, empty, none; a deployed
// stage has no default, and the report says why the check was skipped.
func TestEventsQueueIsFoundAsMakeDevFindsIt(t *testing.T) {
	dir := t.TempDir()
	devEnv := filepath.Join(dir, "env")
	fromFile := "http://127.0.0.1:14100/100010001000/holdfast-events"
	// As internal/services writes it.
	if err := os.WriteFile(devEnv, []byte("export HOLDFAST_REDIS_ADDR=127.0.0.1:16379\n"+
		"export HOLDFAST_DB_DSN='holdfast@tcp(127.0.0.1:13306)/holdfast?parseTime=true'\n"+
		"export HOLDFAST_EVENTS_QUEUE_URL="+fromFile+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	noEnv := func(string) string { return "" }
	withEnv := func(k string) string {
		if k == eventsQueueVar {
			return "http://127.0.0.1:9/1/from-env"
		}
		return ""
	}
	for _, c := range []struct {
		name      string
		explicit  *string
		api, file string
		getenv    func(string) string
		want      string
		skip      string // a part of the reason
	}{
		{name: "make dev's, from its env file", api: "http://127.0.0.1:3000", file: devEnv, getenv: noEnv, want: fromFile},
		{name: "make dev's, from the environment", api: "http://localhost:3000", file: devEnv, getenv: withEnv, want: "http://127.0.0.1:9/1/from-env"},
		{name: "make dev not started", api: "http://127.0.0.1:3000", file: filepath.Join(dir, "none"), getenv: noEnv, skip: "make dev's events queue not found"},
		{name: "-events-queue names one", explicit: str("https://sqs.eu-west-1.amazonaws.com/1/orders"), api: "http://127.0.0.1:3000", file: devEnv, getenv: withEnv,
			want: "https://sqs.eu-west-1.amazonaws.com/1/orders"},
		{name: `-events-queue ""`, explicit: str(""), api: "http://127.0.0.1:3000", file: devEnv, getenv: withEnv, skip: `-events-queue ""`},
		{name: "a deployed stage without it", api: "https://abc.execute-api.eu-west-1.amazonaws.com/dev", file: devEnv, getenv: withEnv, skip: "EventBridge"},
		{name: "a deployed stage with it", explicit: str("https://sqs.eu-west-1.amazonaws.com/1/orders"), api: "https://abc.execute-api.eu-west-1.amazonaws.com/dev",
			file: devEnv, getenv: noEnv, want: "https://sqs.eu-west-1.amazonaws.com/1/orders"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, skip := eventsQueueURL(c.explicit, c.api, c.file, c.getenv)
			if got != c.want || (c.skip == "") != (skip == "") || !strings.Contains(skip, c.skip) {
				t.Errorf("eventsQueueURL = %q, skipped %q; want %q, skipped %q", got, skip, c.want, c.skip)
			}
		})
	}
}
