package main

// The reserve handler's CPU per accepted reservation, what a Lambda bills:
// the function's handler called in this process as the runtime calls it
// (an API Gateway event in, a response out), with nothing else running,
// measured by the process's own rusage, on a SKU with a sale window, a
// per-user limit and a pay window. Before and after the direct send.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/testkit/apievent"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

// processCPU is this process's CPU time so far (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Send modes of the handler CPU part, by HOLDFAST_SQS_SEND.
const (
	modeHandlerSDK    = "reserve handler, SDK SendMessage (before)"
	modeHandlerDirect = "reserve handler, direct send (after)"
)

// handlerGoal is the reserve handler's CPU budget per accepted reservation.
const handlerGoal = 150 * time.Microsecond

func (b *bench) handlerCPU(ctx context.Context) error {
	for _, m := range []struct{ send, name string }{{"sdk", modeHandlerSDK}, {"direct", modeHandlerDirect}} {
		cfg := b.cfg
		cfg.SQSSend = m.send
		a, err := app.Build(ctx, cfg, app.Options{Function: "bench", Out: io.Discard})
		if err != nil {
			return err
		}
		b.closers = append(b.closers, a.Close)
		api := a.Handlers(nil).API
		sku := fmt.Sprintf("bench-cpu-%s-%d", m.send, time.Now().UnixNano())
		// Every per-SKU check the reserve path has, on: a sale window
		// (open), a per-user limit, a pay window.
		c := reservation.SetTo(sku, bigStock)
		opens, closes, pay, limit := time.Now().Add(-time.Minute), time.Now().Add(time.Hour), 15*time.Minute, 5
		c.OpensAt, c.ClosesAt, c.PayWithin, c.Limit = &opens, &closes, &pay, &limit
		if _, err := a.Service.ChangeStock(ctx, c); err != nil {
			return err
		}
		body := fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
		b.log("handler CPU: %s …", m.name)
		cpu0 := processCPU()
		ops, el, lat, err := hammer(b.o.concurrency, b.o.duration, func(w, i int) error {
			ev := apievent.New(http.MethodPost, "/reservations", body, map[string]string{"content-type": "application/json"})
			ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
				JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": fmt.Sprintf("cpu-u%d-%d", w, i)}},
			}
			resp, err := api.Handle(ctx, ev)
			if err == nil && resp.StatusCode != http.StatusAccepted {
				err = fmt.Errorf("handler answered %d: %s", resp.StatusCode, resp.Body)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		cpu := processCPU() - cpu0
		if b.handlerPer == nil {
			b.handlerPer = map[string]time.Duration{}
		}
		b.handlerPer[m.send] = cpu / time.Duration(max(ops, 1))
		b.results = append(b.results, result{group: "cpu", name: m.name, ops: ops, elapsed: el, lat: lat,
			extra: map[string]string{"handler CPU": fmt.Sprintf("%.0f µs/accepted", float64(cpu.Microseconds())/float64(max(ops, 1)))}})
		if _, err := b.app.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &b.cfg.QueueURL}); err != nil {
			b.log("purge: %v", err)
		}
	}
	return nil
}

// handlerLines are the handler CPU part's summary lines.
func (b *bench) handlerLines() []string {
	direct, ok := b.handlerPer["direct"]
	if !ok {
		return nil
	}
	return []string{fmt.Sprintf("reserve handler CPU per accepted reservation = %d µs (goal ≤ %d µs): direct send; %d µs with the SDK's SendMessage",
		direct.Microseconds(), handlerGoal.Microseconds(), b.handlerPer["sdk"].Microseconds())}
}
