package main

// The reserve handler's CPU per accepted reservation, what a Lambda bills:
// the function's handler called in this process as the runtime calls it
// (an API Gateway event in, a response out), with nothing else running,
// measured by the process's own rusage, on a SKU with a sale window, a
// per-user limit and a pay window. Before and after the direct send, and
// with the direct send on a SKU with a waiting room as well: each call then
// carries its buyer's admission token, admitted before the timed part, and
// so is keyed (the admission fixes the id: a new hold is checked in MySQL).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
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
	modeHandlerRoom   = "reserve handler, admission token"
)

// roomRate is how many buyers a second of the handler part's duration it
// admits for its waiting-room mode: more calls than these cores reach.
const roomRate = 25000

// handlerGoal is the reserve handler's CPU budget per accepted reservation.
const handlerGoal = 150 * time.Microsecond

func (b *bench) handlerCPU(ctx context.Context) error {
	for _, m := range []struct {
		send, name string
		room       bool
	}{{"sdk", modeHandlerSDK, false}, {"direct", modeHandlerDirect, false}, {"direct", modeHandlerRoom, true}} {
		cfg := b.cfg
		cfg.SQSSend = m.send
		cfg.Protocol.AdmitFor = stackAdmitFor // admitting the pool takes a while (-d long: longer)
		a, err := app.Build(ctx, cfg, app.Options{Function: "bench", Out: io.Discard})
		if err != nil {
			return err
		}
		b.closers = append(b.closers, a.Close)
		api := a.Handlers(nil).API
		sku := fmt.Sprintf("bench-cpu-%s-%d", m.send, time.Now().UnixNano())
		// Every per-SKU check the reserve path has, on: a sale window
		// (open), a per-user limit, a pay window; and the room, in its mode.
		c := reservation.SetTo(sku, bigStock)
		opens, closes, pay, limit, room := time.Now().Add(-time.Minute), time.Now().Add(time.Hour), 15*time.Minute, 5, m.room
		c.OpensAt, c.ClosesAt, c.PayWithin, c.Limit, c.WaitingRoom = &opens, &closes, &pay, &limit, &room
		if _, err := a.Service.ChangeStock(ctx, c); err != nil {
			return err
		}
		var admissions []string
		var next atomic.Int64
		if m.room {
			pool := int(b.o.duration.Seconds()*roomRate) + 1000
			b.log("handler CPU: admitting %d buyers to the waiting room …", pool)
			if admissions, err = admitAll(ctx, a.Service, sku, "cpu-room-u", pool); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
		body := fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
		b.log("handler CPU: %s …", m.name)
		runtime.GC() // the setup's garbage is not the handler's
		cpu0 := processCPU()
		ops, el, lat, err := hammer(b.o.concurrency, b.o.duration, func(w, i int) error {
			user := fmt.Sprintf("cpu-u%d-%d", w, i)
			headers := map[string]string{"content-type": "application/json"}
			if m.room {
				n := next.Add(1) - 1
				if n >= int64(len(admissions)) {
					return fmt.Errorf("the %d admitted buyers are used up: raise roomRate", len(admissions))
				}
				user = fmt.Sprintf("cpu-room-u%d", n)
				headers["admission-token"] = admissions[n]
			}
			ev := apievent.New(http.MethodPost, "/reservations", body, headers)
			ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
				JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": user}},
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
		b.handlerPer[m.name] = cpu / time.Duration(max(ops, 1))
		b.results = append(b.results, result{group: "cpu", name: m.name, ops: ops, elapsed: el, lat: lat,
			extra: map[string]string{"handler CPU": fmt.Sprintf("%.0f µs/accepted", float64(cpu.Microseconds())/float64(max(ops, 1)))}})
		if _, err := b.app.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &b.cfg.QueueURL}); err != nil {
			b.log("purge: %v", err)
		}
	}
	return nil
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
	return []string{fmt.Sprintf("reserve handler CPU per accepted reservation = %d µs (goal ≤ %d µs): direct send, an admission token each (waiting room); %d µs without the room; %d µs with the SDK's SendMessage, without the room",
		room.Microseconds(), handlerGoal.Microseconds(), b.handlerPer[modeHandlerDirect].Microseconds(), b.handlerPer[modeHandlerSDK].Microseconds())}
}
