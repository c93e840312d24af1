package awsjson_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/awsjson"
)

// Adversarial review (review2). The package says a Client "retries what the
// SDK's standard retryer retries (…throttling), a bounded number of times
// within the context's deadline". The SDK's standard retryer waits an
// exponential jittered backoff between attempts (up to 2 s before the
// second, 4 s before the third, capped at 20 s): it rides out a short
// throttle. The Client waits reservation.Backoff (at most 2 ms, then 4 ms),
// so all three attempts land inside any throttle window longer than a few
// milliseconds: a 150 ms burst of ThrottlingException from EventBridge (its
// PutEvents quota) fails the call with 4.8 s of the caller's deadline left,
// and the events wait for the sweeper's drain.
func TestReview2ThrottleOutlastsTheRetries(t *testing.T) {
	var mu sync.Mutex
	var start time.Time
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		if start.IsZero() {
			start = time.Now()
		}
		throttled := time.Since(start) < 150*time.Millisecond
		mu.Unlock()
		if throttled {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"ThrottlingException","message":"Rate exceeded"}`)
			return
		}
		fmt.Fprint(w, `{"FailedEntryCount":0,"Entries":[{"EventId":"e"}]}`)
	}))
	defer srv.Close()
	// The default Sleep: the backoff the package really waits.
	c, err := awsjson.NewClient(awsjson.EventBridge, awsjson.Config{Endpoint: srv.URL, Region: "eu-west-1", Credentials: creds, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	err = c.Call(ctx, "PutEvents", []byte(`{"Entries":[]}`), accept)
	took := time.Since(began)
	if err != nil {
		dl, _ := ctx.Deadline()
		t.Errorf("PutEvents through a 150 ms throttle = %v after %d attempts in %v (%v of the deadline left); "+
			"the SDK's retryer would back off long enough to succeed", err, n, took.Round(time.Millisecond), time.Until(dl).Round(100*time.Millisecond))
	}
}
