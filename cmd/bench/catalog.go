package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// A catalog import: catalogWriters admins creating catalogSKUs distinct new
// SKUs at once (issue 20: about 10 % answered 503, 1213 Deadlock).
const (
	catalogWriters = 16
	catalogSKUs    = 20_000
)

const modeCatalog = "catalog import: distinct new SKUs"

// catalog creates catalogSKUs new SKUs from catalogWriters writers through
// the admin path (the service's ChangeStock: MySQL, then Redis), writer w's
// i-th SKU beside every other writer's i-th, so their rows are neighbours in
// product_stock's primary key at the same moment. Any failed creation fails
// the part; InnoDB's deadlock counter (server-wide) shows whether any two
// waited for each other on the way.
func (b *bench) catalog(ctx context.Context) error {
	run := b.fmtRun()
	deadlocks := func() (int64, bool) {
		var n int64
		err := b.app.DB.QueryRowContext(ctx, `SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'`).Scan(&n)
		return n, err == nil
	}
	before, countable := deadlocks()
	b.log("catalog: %d new SKUs from %d writers …", catalogSKUs, catalogWriters)
	var failed atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for w := range catalogWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, catalogSKUs/catalogWriters)
			for i := w; i < catalogSKUs; i += catalogWriters {
				c := reservation.SetTo(fmt.Sprintf("bench-cat-%s-%05d-%02d", run, i/catalogWriters, w), 100)
				if i%2 == 1 {
					c.Key = fmt.Sprintf("import-%s-%d", run, i) // an import that retries safely
				}
				t := time.Now()
				if _, err := b.app.Service.ChangeStock(ctx, c); err != nil {
					if failed.Add(1) == 1 {
						mu.Lock()
						firstErr = fmt.Errorf("%s: %w", c.SKU, err)
						mu.Unlock()
					}
					continue
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	dl := "n/a"
	if after, ok := deadlocks(); ok && countable {
		dl = fmt.Sprint(after - before)
	}
	r := result{group: "admin", name: fmt.Sprintf("%s, %d writers", modeCatalog, catalogWriters), ops: int64(len(lat)), elapsed: elapsed, lat: lat,
		extra: map[string]string{"errors": fmt.Sprint(failed.Load()), "deadlocks": dl}}
	b.results = append(b.results, r)
	b.checks = append(b.checks, fmt.Sprintf("catalog import: %d of %d creations by %d writers failed, %s deadlocks (goal 0 and 0)",
		failed.Load(), catalogSKUs, catalogWriters, dl))
	if failed.Load() > 0 {
		return fmt.Errorf("catalog import: %d of %d creations failed; first: %w", failed.Load(), catalogSKUs, firstErr)
	}
	return nil
}
