package main

// The reserve handler's CPU per accepted reservation, what a Lambda bills:
// the function's handler as its main wires it (metrics.Flushing around
// the API handler's Invoke, the metrics line written to a file), called through the
// Lambda runtime library's handler, as the runtime calls it: the event's
// JSON in (API Gateway's payload 2.0 with the headers and JWT claims it
// passes, built before the timed part), the response's JSON out. Measured
// by the process's own CPU clock (the host sampler's thread left out),
// after the machine is quiet, on a SKU with a
// sale window, a per-user limit and a pay window. Before and after the
// direct send, and with the direct send on a SKU with a waiting room as
// well: each call then carries its buyer's admission token, admitted
// before the timed part, and so is keyed (the admission fixes the id).
// Left out: the runtime's HTTP exchange with the Lambda Runtime API.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/testkit/apievent"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/metrics"
	"github.com/holdfast/holdfast/shared/reservation"
	"golang.org/x/sys/unix"
)

// processCPU is this process's CPU time so far (user + system):
// CLOCK_PROCESS_CPUTIME_ID, which brings the calling thread's time up to
// now and reads the others' as of their last tick or switch (4 ms here at
// most; the parts read it with the other threads idle).
func processCPU() time.Duration { return clockCPU(unix.CLOCK_PROCESS_CPUTIME_ID) }

// threadCPU is the calling OS thread's CPU time so far, to the nanosecond
// (getrusage's RUSAGE_THREAD stops at the thread's last tick); the caller
// locks its goroutine to the thread.
func threadCPU() time.Duration { return clockCPU(unix.CLOCK_THREAD_CPUTIME_ID) }

// clockCPU reads a CPU clock. checkClocks has shown at start that both
// read, so a 0 here is not a figure taken silently.
func clockCPU(clock int32) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// checkClocks fails unless both CPU clocks read and advance with work: a
// figure of 0 µs would otherwise meet every goal.
func checkClocks() error {
	for _, c := range []struct {
		name  string
		clock int32
	}{{"CLOCK_PROCESS_CPUTIME_ID", unix.CLOCK_PROCESS_CPUTIME_ID}, {"CLOCK_THREAD_CPUTIME_ID", unix.CLOCK_THREAD_CPUTIME_ID}} {
		var t0, t1 unix.Timespec
		if err := unix.ClockGettime(c.clock, &t0); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		var sum [32]byte
		for range 2000 {
			sum = sha256.Sum256(sum[:])
		}
		if err := unix.ClockGettime(c.clock, &t1); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if t1.Nano() <= t0.Nano() {
			return fmt.Errorf("%s did not advance over 2000 SHA-256s (%d)", c.name, sum[0])
		}
	}
	return nil
}

// Send modes of the handler CPU part, by HOLDFAST_SQS_SEND.
const (
	modeHandlerSDK    = "reserve handler, SDK SendMessage (before)"
	modeHandlerDirect = "reserve handler, direct send (after)"
	modeHandlerRoom   = "reserve handler, admission token"
)

// roomRate is how many buyers a second of the handler part's duration it
// admits for its waiting-room mode: more calls than these cores reach.
const roomRate = 25000

// handlerGoal is the reserve handler's CPU budget per accepted reservation.
const handlerGoal = 150 * time.Microsecond

// handlerRounds is how many times the handler part runs each mode, the
// modes in turn, each run a share of -d: the same code's figure moves
// from one minute to the next on this host (docs/benchmarks.md, "The
// host's speed moves the figures"), and a mode measured in one stretch
// took whatever that stretch gave.
const handlerRounds = 3

// handlerMode is one configuration of the handler part.
type handlerMode struct {
	send, name string
	room       bool
}

// handlerRun is what a mode's rounds add up to.
type handlerRun struct {
	ops  int64
	cpu  time.Duration
	el   time.Duration
	lat  []time.Duration
	refs []string
}

func (b *bench) handlerCPU(ctx context.Context) error {
	modes := []handlerMode{{"sdk", modeHandlerSDK, false}, {"direct", modeHandlerDirect, false}, {"direct", modeHandlerRoom, true}}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, devNull.Close)
	apps := map[string]*app.App{}
	for _, m := range modes {
		cfg := b.cfg
		cfg.SQSSend = m.send
		cfg.Protocol.AdmitFor = stackAdmitFor // admitting the pool takes a while (-d long: longer)
		// The template's hold TTL: the room mode cost about 13 µs more per
		// reservation with benchHoldTTL (six pairs, docs/benchmarks.md). The
		// part runs late, so its holds expire after the parts with sweepers.
		// The function's stdout, where its log and metrics lines go: a
		// write each, as to Lambda's pipe.
		a, err := app.Build(ctx, cfg, app.Options{Function: "bench", Out: devNull})
		if err != nil {
			return err
		}
		b.closers = append(b.closers, a.Close)
		apps[m.name] = a
	}
	runs := map[string]*handlerRun{}
	for round := 1; round <= handlerRounds; round++ {
		for _, m := range modes {
			r := runs[m.name]
			if r == nil {
				r = &handlerRun{}
				runs[m.name] = r
			}
			if err := b.handlerRound(ctx, apps[m.name], m, round, r); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
	}
	if b.handlerPer == nil {
		b.handlerPer = map[string]time.Duration{}
	}
	for _, m := range modes {
		r := runs[m.name]
		sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
		b.handlerPer[m.name] = r.cpu / time.Duration(max(r.ops, 1))
		b.handlerRefs = append(b.handlerRefs, m.name+": "+strings.Join(r.refs, ", "))
		b.results = append(b.results, result{group: "cpu", name: m.name, ops: r.ops, elapsed: r.el, lat: r.lat,
			extra: map[string]string{"handler CPU": fmt.Sprintf("%.0f µs/accepted", float64(r.cpu.Microseconds())/float64(max(r.ops, 1))), "runs": strconv.Itoa(handlerRounds)}})
	}
	return nil
}

// handlerRound runs mode m once, on a SKU of its own, and adds it to r.
func (b *bench) handlerRound(ctx context.Context, a *app.App, m handlerMode, round int, r *handlerRun) error {
	invoke := lambda.NewHandler(httpapi.Invoker(metrics.Flushing(a.Metrics, a.Handlers(nil).API.Invoke)))
	sku := fmt.Sprintf("bench-cpu-%s-%d", m.send, time.Now().UnixNano())
	// Every per-SKU check the reserve path has, on: a sale window
	// (open), a per-user limit, a pay window; and the room, in its mode.
	c := reservation.SetTo(sku, bigStock)
	opens, closes, pay, limit, room := time.Now().Add(-time.Minute), time.Now().Add(time.Hour), 15*time.Minute, 5, m.room
	c.OpensAt, c.ClosesAt, c.PayWithin, c.Limit, c.WaitingRoom = &opens, &closes, &pay, &limit, &room
	if _, err := a.Service.ChangeStock(ctx, c); err != nil {
		return err
	}
	pool := int(roundOf(b.o.duration, handlerRounds).Seconds()*roomRate) + 1000 // more calls than these cores reach
	var admissions []string
	if m.room {
		b.log("handler CPU: admitting %d buyers to the waiting room …", pool)
		var err error
		if admissions, err = admitAll(ctx, a.Service, sku, "cpu-room-u", pool); err != nil {
			return err
		}
	}
	b.log("handler CPU: %d events of %s …", pool, m.name)
	payloads, err := reserveEvents(sku, m.send, admissions, pool)
	if err != nil {
		return err
	}
	var next atomic.Int64
	b.log("handler CPU: %s, round %d of %d …", m.name, round, handlerRounds)
	runtime.GC() // the setup's garbage is not the handler's
	if err := b.awaitQuiet(ctx, "handler CPU"); err != nil {
		return err
	}
	host, err := startHostSampler()
	if err != nil {
		return err
	}
	defer host.Stop()
	cpu0 := processCPU()
	machine0, err := machineCPU()
	if err != nil {
		return err
	}
	var ops int64
	var el time.Duration
	var lat []time.Duration
	// Labelled for -profile: goroutines started inside (the HTTP
	// client's) carry the mode too.
	pprof.Do(ctx, pprof.Labels("part", m.name), func(ctx context.Context) {
		ops, el, lat, err = hammer(b.o.concurrency, roundOf(b.o.duration, handlerRounds), func(w, i int) error {
			n := next.Add(1) - 1
			if n >= int64(len(payloads)) {
				return fmt.Errorf("the %d events are used up: raise roomRate", len(payloads))
			}
			out, err := invoke.Invoke(ctx, payloads[n])
			if err != nil {
				return err
			}
			// What the runtime posts back, checked without decoding it here:
			// the bench's own work stays out of the figure.
			if !bytes.Contains(out, []byte(`"statusCode":202,`)) {
				return fmt.Errorf("handler answered %.300s", out)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	speed := host.Stop()                   // before the process's clock: all its work inside the window
	cpu := processCPU() - cpu0 - speed.own // the sampler's thread is not the handler's
	machine1, err := machineCPU()
	if err != nil {
		return err
	}
	b.log("handler CPU: %s, round %d: %d accepted, %.0f µs each; this process %v without the host sampler, the machine %v with it; the host under the run's load: %v (%d samples, the sampler's thread %v)",
		m.name, round, ops, float64(cpu.Microseconds())/float64(max(ops, 1)), cpu.Round(time.Millisecond), (machine1 - machine0).Round(time.Millisecond), speed, speed.samples, speed.own.Round(time.Millisecond))
	r.ops += ops
	r.cpu += cpu
	r.el += el
	r.lat = append(r.lat, lat...)
	r.refs = append(r.refs, fmt.Sprintf("%.0f µs (%v)", float64(cpu.Microseconds())/float64(max(ops, 1)), speed))
	if _, err := b.app.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &b.cfg.QueueURL}); err != nil {
		b.log("purge: %v", err)
	}
	return nil
}

// reserveEvents are n events of a buy of one unit of sku, a buyer each
// (with admissions[i] when there are admissions), as API Gateway's HTTP API
// passes them to the function (payload 2.0): the headers a browser and
// CloudFront send, the bearer token, the JWT authorizer's claims.
func reserveEvents(sku, tag string, admissions []string, n int) ([][]byte, error) {
	out := make([][]byte, n)
	body := fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6ImRldiIsInR5cCI6IkpXVCJ9." + strings.Repeat("x", 260) + "." + strings.Repeat("s", 342)
	now := time.Now()
	for i := range out {
		user := fmt.Sprintf("cpu-%s-u%d", tag, i)
		headers := map[string]string{
			"accept": "application/json", "accept-encoding": "gzip, deflate, br", "accept-language": "en-GB,en;q=0.9",
			"authorization": "Bearer " + jwt, "content-length": fmt.Sprint(len(body)), "content-type": "application/json",
			"host": "abc123.execute-api.eu-west-1.amazonaws.com", "origin": "https://shop.example.com",
			"user-agent":      "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
			"x-amzn-trace-id": fmt.Sprintf("Root=1-%08x-%024d", now.Unix(), i),
			"x-forwarded-for": "203.0.113.7", "x-forwarded-port": "443", "x-forwarded-proto": "https",
			"idempotency-key": fmt.Sprintf("k-%d", i),
		}
		if admissions != nil {
			user = fmt.Sprintf("cpu-room-u%d", i)
			headers["admission-token"] = admissions[i]
		}
		ev := apievent.New(http.MethodPost, "/reservations", body, headers)
		ev.RawQueryString = ""
		ev.RequestContext.AccountID, ev.RequestContext.APIID = "123456789012", "abc123"
		ev.RequestContext.DomainName, ev.RequestContext.DomainPrefix = "abc123.execute-api.eu-west-1.amazonaws.com", "abc123"
		ev.RequestContext.RequestID = fmt.Sprintf("Req%012dId=", i)
		ev.RequestContext.Time, ev.RequestContext.TimeEpoch = now.UTC().Format("02/Jan/2006:15:04:05 -0700"), now.UnixMilli()
		ev.RequestContext.HTTP.Protocol, ev.RequestContext.HTTP.SourceIP = "HTTP/1.1", "203.0.113.7"
		ev.RequestContext.HTTP.UserAgent = headers["user-agent"]
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{
				"sub": user, "iss": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example", "aud": "holdfast-shop",
				"iat": fmt.Sprint(now.Unix()), "nbf": fmt.Sprint(now.Unix()), "exp": fmt.Sprint(now.Add(time.Hour).Unix()),
				"token_use": "id", "auth_time": fmt.Sprint(now.Unix()),
			}},
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// admitAll joins n buyers (prefix and 0…n-1) to sku's waiting room and
// returns each one's admission token, in that order: a room whose stock
// serves them all admits them at once.
func admitAll(ctx context.Context, svc *reservation.Service, sku, prefix string, n int) ([]string, error) {
	out := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				user := fmt.Sprintf("%s%d", prefix, i)
				_, err := svc.JoinQueue(ctx, user, sku)
				var a reservation.Admission
				if err == nil {
					_, a, err = svc.Ticket(ctx, user, sku, svc.TicketOf(sku, user))
				}
				if err == nil && a.Token == "" {
					err = errors.New("not admitted")
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("admit %s: %w", user, err)
					}
					mu.Unlock()
					return
				}
				out[i] = a.Token
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

// handlerLines are the handler CPU part's summary lines: the figure is the
// waiting room's (every check of the reserve path on, the admission too).
func (b *bench) handlerLines() []string {
	room, ok := b.handlerPer[modeHandlerRoom]
	if !ok {
		return nil
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return []string{fmt.Sprintf("reserve handler CPU per accepted reservation = %.0f µs (goal ≤ %.0f µs): direct send, an admission token each (waiting room); %.0f µs without the room; %.0f µs with the SDK's SendMessage, without the room; each %d runs of %v, the modes in turn; each run's figure with the host's speed under its load, the median thread CPU of a SHA-256 of 64 KiB and of a link of a random walk through 64 MiB, sampled every 25 ms (%v idle when the bench started): %s",
		us(room), us(handlerGoal), us(b.handlerPer[modeHandlerDirect]), us(b.handlerPer[modeHandlerSDK]),
		handlerRounds, roundOf(b.o.duration, handlerRounds), b.refStart, strings.Join(b.handlerRefs, "; "))}
}
