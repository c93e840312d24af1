package main

// Accept → CONFIRMED at the reserve floor's arrival rate (20,000/s when the
// floor was not measured in this run). goaws cannot carry
// that rate, so an in-memory queue stands in for SQS; the batcher hands
// persist batches as Lambda's event source does (BatchSize records or the
// batching window, whichever comes first) to MaximumConcurrency consumers,
// all three taken from template.yaml.

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

type arrival struct {
	r  reservation.Reservation
	at time.Time
}

// confirmLag: reservations arrive for twice the reserve modes' duration.
func (b *bench) confirmLag(ctx context.Context) error {
	lagDuration := 2 * b.o.duration
	tpl, err := samtemplate.Load("template.yaml")
	if err != nil {
		return err
	}
	ev := tpl.Functions()["PersistFunction"].SQS["Reservations"]
	// Arrivals at the rate holdfast accepted them in the reserve part (its
	// path with the send), not the raw script's floor: a cheaper script
	// raised the floor past what this machine's two cores accept while
	// persist runs beside it, and the reserve calls timed out.
	rate := 20_000.0
	if send, ok := b.find(modeSend); ok {
		rate = send.rate()
	}
	svc, err := b.service(ctx, b.cfg, app.Options{})
	if err != nil {
		return err
	}
	sku := fmt.Sprintf("bench-lag-%d", time.Now().UnixNano())
	if _, err := svc.ChangeStock(ctx, reservation.SetTo(sku, bigStock)); err != nil {
		return err
	}
	b.log("accept → CONFIRMED: %.0f arrivals/s for %v, BatchSize %d, window %d s, %d consumers …",
		rate, lagDuration, ev.BatchSize, ev.MaximumBatchingWindow, ev.MaximumConcurrency)
	queue := make(chan arrival, 1<<20)
	batches := make(chan []arrival, ev.MaximumConcurrency)
	var mu sync.Mutex
	var lags []time.Duration
	var failed int

	var consumers sync.WaitGroup
	for range max(1, ev.MaximumConcurrency) {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for batch := range batches {
				rs := make([]reservation.Reservation, len(batch))
				for i, a := range batch {
					rs[i] = a.r
				}
				errs := svc.PersistBatch(ctx, rs)
				done := time.Now()
				mu.Lock()
				for i, a := range batch {
					if errs[i] != nil {
						failed++
						continue
					}
					lags = append(lags, done.Sub(a.at))
				}
				mu.Unlock()
			}
		}()
	}
	go func() { // the event source: BatchSize, or the window since the batch's first record
		defer close(batches)
		window := time.Duration(max(ev.MaximumBatchingWindow, 0)) * time.Second
		var batch []arrival
		var timer <-chan time.Time
		for {
			select {
			case a, ok := <-queue:
				if !ok {
					if len(batch) > 0 {
						batches <- batch
					}
					return
				}
				if len(batch) == 0 {
					timer = time.After(window)
				}
				batch = append(batch, a)
				if len(batch) >= ev.BatchSize {
					batches <- batch
					batch, timer = nil, nil
				}
			case <-timer:
				batches <- batch
				batch, timer = nil, nil
			}
		}
	}()

	// Arrivals: the reserve script, pipelined 1 ms worth at a time.
	script := redis.NewScript(redisstore.ReserveLua)
	if err := script.Load(ctx, b.app.Redis).Err(); err != nil {
		return err
	}
	start := time.Now()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
	for now := range tick.C {
		elapsed := now.Sub(start)
		if elapsed >= lagDuration {
			break
		}
		due := int(rate*elapsed.Seconds()) - sent
		if due <= 0 {
			continue
		}
		rs := make([]reservation.Reservation, due)
		cmds, err := b.app.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range rs {
				rs[i] = reservation.Reservation{ID: fmt.Sprintf("%s.lag%d", sku, sent+i), SKU: sku, Qty: 1,
					UserID: fmt.Sprintf("lag-u%d", sent+i), Token: fmt.Sprintf("t%d", sent+i)}
				script.EvalSha(ctx, p, redisstore.ReserveKeys(rs[i]), redisstore.ReserveArgs(rs[i], time.Hour, 0, 0)...)
			}
			return nil
		})
		if err != nil {
			tick.Stop()
			return fmt.Errorf("accept → CONFIRMED: reserve: %w", err)
		}
		at := time.Now()
		for i, c := range cmds {
			out, _ := c.(*redis.Cmd).StringSlice()
			if !heldNow(out, rs[i].Token) {
				tick.Stop()
				return fmt.Errorf("accept → CONFIRMED: reserve answered %v", out)
			}
			rs[i].CreatedAt, rs[i].ExpiresAt = at, at.Add(time.Hour)
			queue <- arrival{r: rs[i], at: at}
		}
		sent += due
	}
	tick.Stop()
	arrived := time.Since(start)
	close(queue)
	consumers.Wait()
	if failed > 0 {
		return fmt.Errorf("accept → CONFIRMED: %d persists failed", failed)
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	b.results = append(b.results, result{group: "pipeline",
		name: fmt.Sprintf("accept → CONFIRMED, %.0f arrivals/s", float64(sent)/arrived.Seconds()),
		ops:  int64(sent), elapsed: time.Since(start), lat: lags,
		extra: map[string]string{"batching": fmt.Sprintf("BatchSize %d, window %d s, %d consumers", ev.BatchSize, ev.MaximumBatchingWindow, ev.MaximumConcurrency)}})
	return nil
}

// heldNow reports whether the reserve script's answer says this call's hold
// (token) is HELD: OK, or the REPLAY a retried call gets (go-redis sends a
// pipeline again after a timeout; the script is idempotent per token).
func heldNow(out []string, token string) bool {
	if len(out) >= 3 && out[0] == "OK" {
		return true
	}
	if len(out) == 0 || out[0] != "REPLAY" {
		return false
	}
	fields := map[string]string{}
	for i := 1; i+1 < len(out); i += 2 {
		fields[out[i]] = out[i+1]
	}
	return fields["token"] == token && fields["state"] == "HELD"
}
