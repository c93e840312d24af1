package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/loadgen"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// room: one sale sold twice through the dev stack (template settings), the
// load tool's -room mode: without the waiting room, then with it, the same
// stock and buyers. Its five figures go in the summary; both runs must
// pass their invariant reports.
func (b *bench) room(ctx context.Context) error {
	cfg := b.cfg
	cfg.Protocol.SoldOutTTL = reservation.DefaultConfig().SoldOutTTL
	jwtDir, err := os.MkdirTemp("", "holdfast-bench-jwt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(jwtDir)
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		return err
	}
	stack, err := devstack.Start(ctx, cfg, devstack.Options{Addr: "127.0.0.1:0", Template: "template.yaml", DLQURL: b.getenv("HOLDFAST_DLQ_URL"),
		Log: slog.New(slog.DiscardHandler), Verifier: issuer.Verifier()})
	if err != nil {
		return err
	}
	defer stack.Stop()
	lc := loadgen.Config{BaseURL: stack.URL, N: b.o.roomN, Concurrency: 64, SKU: fmt.Sprintf("bench-room-%d", time.Now().UnixNano()),
		Stock: b.o.roomStock, Settle: 3 * time.Minute, OpenAfter: 3 * time.Second, AdmitFactor: 1,
		TokenFor:   func(user string) (string, error) { return issuer.Mint(user, time.Hour) },
		EventsSkip: "make bench measures; make load and its tests read the events"}
	if rdb, ok := b.app.Redis.(*redis.Client); ok {
		counters, err := loadgen.CountersOf(ctx, rdb, b.app.DB)
		if err != nil {
			return err
		}
		defer counters.Close()
		lc.Counters = counters
	} else {
		lc.CountersSkip = "Redis is a cluster here: INFO commandstats of one node is not the whole"
	}
	b.log("waiting room: %d buyers for %d units, without and with the room, through the dev stack …", lc.N, lc.Stock)
	c, err := loadgen.Compare(ctx, lc)
	if err != nil {
		return err
	}
	if !c.Passed() {
		c.Print(os.Stderr)
		return errors.New("waiting room: a run's invariant report failed")
	}
	b.roomRun = c
	return nil
}

// roomLines are the room part's summary lines.
func (b *bench) roomLines() []string {
	if b.roomRun == nil {
		return nil
	}
	return b.roomRun.Figures()
}
