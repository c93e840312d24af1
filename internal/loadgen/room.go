package loadgen

// The waiting room's sale: every buyer queues before the opening, polls
// the public status once a second as the buyer page does, reserves once
// with its admission token when admitted, and stops at SOLD_OUT. Compare
// runs it beside the flash sale of the same stock and buyers.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Comparison is one sale run twice: without the waiting room (every buyer
// reserves at the opening) and with it.
type Comparison struct {
	Direct, Room *Report
}

// Compare runs cfg's sale twice, on two SKUs of cfg.SKU's name (-direct,
// -room) with the same stock and buyers: the flash sale as Run fires it,
// then through a waiting room (admit factor cfg.AdmitFactor).
func Compare(ctx context.Context, cfg Config) (*Comparison, error) {
	if cfg.Groups > 0 {
		return nil, errors.New("loadgen: the waiting-room comparison sells one SKU: no group rounds")
	}
	base := cfg.SKU
	cfg.SKU = base + "-direct"
	r, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	direct, err := r.sale(ctx, false)
	if err != nil {
		return nil, err
	}
	cfg.SKU = base + "-room"
	r2, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	r2.tokens = r.tokens // the same buyers, their tokens minted once
	room, err := r2.sale(ctx, true)
	if err != nil {
		return nil, err
	}
	return &Comparison{Direct: direct, Room: room}, nil
}

// Passed reports whether both runs passed every check.
func (c *Comparison) Passed() bool { return c.Direct.Passed() && c.Room.Passed() }

// SaleFigures are what the waiting room changes, measured in either run.
type SaleFigures struct {
	Buyers   int
	Attempts int // POST /reservations sent, retries included
	Sold     int // units CONFIRMED
	// SoldOutLag is, for every buyer whose sale ended in SOLD_OUT, from
	// the last unit's hold (the last 202 answer) to when that buyer heard
	// SOLD_OUT (0 if before it).
	SoldOutLag Percentiles
	// Unserved buyers ended without a unit; Unsold is the units MySQL has
	// left at the end if any did (0 if every buyer got one).
	Unserved int
	Unsold   int64
}

// AttemptsPerUnit is reserve attempts per unit sold.
func (f SaleFigures) AttemptsPerUnit() float64 { return float64(f.Attempts) / float64(max(f.Sold, 1)) }

// RoomFigures are the room run's own: its queue, its admissions, its polls.
type RoomFigures struct {
	AdmitFactor float64
	Joined      int // buyers with a ticket
	// Polls of the public status (PollsClosed of them answered before the
	// opening), and looks at a buyer's own ticket.
	Polls, PollsClosed, TicketLooks int
	// Ends counts the buyers' last states (RESERVED, SOLD_OUT, EXPIRED,
	// CLOSED, REJECTED, GAVE_UP).
	Ends map[string]int
	// Admitted tickets seen; in queue order unless Inversions (a ticket
	// admitted before one ahead of it, by Redis's admission times) or Gaps
	// (a place not admitted while one behind it was).
	Admitted, Inversions, Gaps int
	// Cost is the burst of polls' cost to the servers (nil: CostSkipped says why).
	Cost        *PollCost
	CostSkipped string
}

// PollCost is a burst of public-status polls, counted by the servers.
type PollCost struct {
	Polls    int
	Duration time.Duration
	Counted  ServerCount // the servers' counts over the burst, everyone's
	// Idle is the servers' counts over as long a while just before, when
	// the run sent nothing: the work of others (a sweep) a burst may
	// also hold.
	Idle ServerCount
}

// PerPoll is the servers' work per poll a buyer sent: Redis commands (and
// of them scripts), MySQL statements.
func (c PollCost) PerPoll() (redis, scripts, mysql float64) {
	n := float64(max(c.Polls, 1))
	return float64(c.Counted.RedisCommands) / n, float64(c.Counted.RedisScripts) / n, float64(c.Counted.MySQLStatements) / n
}

// waiter is one buyer in the waiting room.
type waiter struct {
	user, ticket string
	position     int64
	// admitted is when Redis admitted the ticket, as its token's expiry
	// (the same AdmitFor after every admission); zero if never seen.
	admitted             time.Time
	end                  string // the buyer's last state
	endAt                time.Time
	outs                 []outcome
	polls, closed, looks int
	// seen is the server_time of the last public state it read.
	seen string
}

// EdgeRefresh is how long the public queue state is cached (its
// Cache-Control max-age, at the edge): a waiter polls again just after the
// answer it read refreshes.
const EdgeRefresh = time.Second

// nextPoll is how long a waiter waits before polling the public state again,
// as web/shop/shop.js does: until just after the answer it read (made at
// its server_time, cached for EdgeRefresh) refreshes, plus up to 200 ms of
// jitter so that one edge's waiters do not all arrive at once; between
// 100 ms and a second. An answer seen before (a cache that keeps it
// longer), or without a time, waits the full second.
func (w *waiter) nextPoll(q map[string]any, now time.Time) time.Duration {
	st, _ := q["server_time"].(string)
	made, err := time.Parse(time.RFC3339Nano, st)
	fresh := err == nil && st != w.seen
	w.seen = st
	if !fresh {
		return EdgeRefresh
	}
	wait := made.Add(EdgeRefresh + rand.N(200*time.Millisecond)).Sub(now)
	return min(max(wait, 100*time.Millisecond), EdgeRefresh)
}

// admitFactor is the room's factor (1 by default).
func (r *runner) admitFactor() float64 {
	if r.cfg.AdmitFactor <= 0 {
		return 1
	}
	return r.cfg.AdmitFactor
}

// setRoomStock makes sku a waiting-room SKU of n units whose sale opens in
// ten minutes (its queue opens HOLDFAST_QUEUE_LEAD, 15 min, before: now),
// so every buyer can queue before the opening moves near (openLater).
func (r *runner) setRoomStock(ctx context.Context, sku string, n int) error {
	var headers map[string]string
	if v, err := r.stock(ctx, sku); err == nil {
		headers = map[string]string{"If-Match": fmt.Sprintf("%q", fmt.Sprint(v.Version))}
	}
	body := map[string]any{"stock": n, "waiting_room": true, "admit_factor": r.admitFactor(),
		"opens_at": time.Now().Add(10 * time.Minute).UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano)}
	code, resp, err := r.doWith(ctx, http.MethodPut, "/admin/skus/"+sku+"/stock", body, "", headers)
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("set the waiting room of %s: %d %v %v", sku, code, resp, err)
	}
	return nil
}

// queueUp queues every buyer of the room run and measures a burst of polls
// while they wait for the opening.
func (r *runner) queueUp(ctx context.Context, rep *Report) ([]*waiter, error) {
	rep.Room = &RoomFigures{AdmitFactor: r.admitFactor()}
	ws, err := r.joinAll(ctx, rep.Room)
	if err != nil {
		return nil, err
	}
	if r.cfg.Counters == nil {
		rep.Room.CostSkipped = r.cfg.CountersSkip
		if rep.Room.CostSkipped == "" {
			rep.Room.CostSkipped = "no server counters given"
		}
		return ws, nil
	}
	rep.Room.Cost, err = r.pollBurst(ctx, r.cfg.SKU)
	return ws, err
}

// busy reports whether an answer is worth the same request again shortly:
// throttled, the service unavailable, or no answer at all.
func busy(code int) bool {
	return code == 0 || code == http.StatusTooManyRequests || code >= 500
}

// joinAll queues every buyer (POST /skus/{sku}/queue): each gets its
// ticket, with no place yet (places are drawn at the opening).
func (r *runner) joinAll(ctx context.Context, f *RoomFigures) ([]*waiter, error) {
	ws := make([]*waiter, r.cfg.N)
	var next, done atomic.Int64
	var failed atomic.Pointer[error]
	start := time.Now()
	stop := make(chan struct{})
	if r.cfg.Progress != nil {
		go progress(r.cfg.Progress, "join   ", &done, r.cfg.N, start, stop)
	}
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= r.cfg.N || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				w := &waiter{user: buyer(i)}
				for attempt := 0; ; attempt++ {
					code, body, err := r.do(ctx, http.MethodPost, "/skus/"+r.cfg.SKU+"/queue", map[string]any{}, w.user)
					if code == http.StatusOK {
						w.ticket, _ = body["ticket"].(string)
						break
					}
					if !busy(code) || attempt >= 10 || ctx.Err() != nil {
						err = fmt.Errorf("loadgen: %s joins the queue of %s: %d %v %v", w.user, r.cfg.SKU, code, body, err)
						failed.CompareAndSwap(nil, &err)
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
				ws[i] = w
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if r.cfg.Progress != nil {
		progressLine(r.cfg.Progress, "join   ", int(done.Load()), r.cfg.N, start)
		fmt.Fprintln(r.cfg.Progress)
	}
	if err := failed.Load(); err != nil {
		return nil, *err
	}
	f.Joined = int(done.Load())
	return ws, ctx.Err()
}

// pollBurst polls sku's public status from Concurrency pollers for
// PollBurst, between two readings of the servers' counters: what a poll
// costs Redis and MySQL (everyone's work in that time counts; the sale's
// buyers are all queued and waiting for the opening, sending nothing). An
// idle while as long comes first, counted the same way.
func (r *runner) pollBurst(ctx context.Context, sku string) (*PollCost, error) {
	d := r.cfg.PollBurst
	if d <= 0 {
		d = 3 * time.Second
	}
	idle, err := r.cfg.Counters.Read(ctx)
	if err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
	}
	before, err := r.cfg.Counters.Read(ctx)
	if err != nil {
		return nil, err
	}
	var polls atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				_, _, _ = r.public(ctx, "/skus/"+sku+"/queue")
				polls.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := r.cfg.Counters.Read(ctx)
	if err != nil {
		return nil, err
	}
	return &PollCost{Polls: int(polls.Load()), Duration: elapsed, Counted: after.Sub(before), Idle: before.Sub(idle)}, nil
}

// wait runs every waiter's page until its sale ended (or Settle ran out),
// with at most Concurrency requests in flight: each polls the public
// status once a second, just after the answer it read refreshes (nextPoll;
// its first poll at a random moment of the first second), asks for its own
// ticket only when admitted_through reached its position (or, once open, to
// learn its position; or the room sold out), reserves once with its admission token when admitted (again only for an
// answer that was no answer: a replay), and stops at SOLD_OUT. It returns
// every reserve attempt.
func (r *runner) wait(ctx context.Context, ws []*waiter, start time.Time) []outcome {
	sem := make(chan struct{}, r.cfg.Concurrency)
	limit := func(f func()) {
		sem <- struct{}{}
		defer func() { <-sem }()
		f()
	}
	deadline := start.Add(r.cfg.Settle)
	var done atomic.Int64
	stop := make(chan struct{})
	if r.cfg.Progress != nil {
		go progress(r.cfg.Progress, "wait   ", &done, len(ws), start, stop)
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done.Add(1)
			r.waitOne(ctx, w, deadline, limit)
		}()
	}
	wg.Wait()
	close(stop)
	if r.cfg.Progress != nil {
		progressLine(r.cfg.Progress, "wait   ", int(done.Load()), len(ws), start)
		fmt.Fprintln(r.cfg.Progress)
	}
	var outs []outcome
	for _, w := range ws {
		outs = append(outs, w.outs...)
	}
	return outs
}

// waitOne is one buyer's page in the waiting room (web/shop/shop.js's poll,
// fetchTicket and buy).
func (r *runner) waitOne(ctx context.Context, w *waiter, deadline time.Time, limit func(func())) {
	sku := r.cfg.SKU
	finish := func(end string) { w.end, w.endAt = end, time.Now() }
	pause := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if !pause(rand.N(time.Second)) {
		finish("GAVE_UP")
		return
	}
	for {
		if ctx.Err() != nil || time.Now().After(deadline) {
			finish("GAVE_UP")
			return
		}
		var code int
		var q map[string]any
		limit(func() { code, q, _ = r.public(ctx, "/skus/"+sku+"/queue") })
		w.polls++
		wait := EdgeRefresh
		if code == http.StatusOK {
			wait = w.nextPoll(q, time.Now())
			open, _ := q["open"].(bool)
			soldOut, _ := q["sold_out"].(bool)
			through, _ := q["admitted_through"].(float64)
			if !open {
				w.closed++
			}
			turn := open && (w.position == 0 || int64(through) >= w.position)
			if turn || soldOut {
				if end := r.lookTicket(ctx, w, limit); end != "" {
					finish(end)
					return
				}
			}
		}
		if !pause(wait) {
			finish("GAVE_UP")
			return
		}
	}
}

// lookTicket asks for w's ticket and acts on it: its position while it
// waits (""), or, admitted, the reserve with its token; it returns the
// buyer's end ("" while it waits).
func (r *runner) lookTicket(ctx context.Context, w *waiter, limit func(func())) string {
	var code int
	var t map[string]any
	limit(func() { code, t, _ = r.do(ctx, http.MethodGet, "/skus/"+r.cfg.SKU+"/queue/"+w.ticket, nil, w.user) })
	w.looks++
	if code != http.StatusOK {
		return ""
	}
	if p, ok := t["position"].(float64); ok {
		w.position = int64(p)
	}
	status, _ := t["status"].(string)
	switch status {
	case "WAITING":
		return ""
	case "ADMITTED":
		exp, _ := t["admission_expires_at"].(string)
		w.admitted, _ = time.Parse(time.RFC3339Nano, exp)
		tok, _ := t["admission_token"].(string)
		for attempt := 0; ; attempt++ {
			var o outcome
			limit(func() { o = r.reserveWith(ctx, r.cfg.SKU, w.user, "", map[string]string{"Admission-Token": tok}) })
			w.outs = append(w.outs, o)
			switch {
			case o.status == http.StatusAccepted:
				return "RESERVED"
			case o.code == "sold_out":
				return "SOLD_OUT"
			case o.code == "admission_expired":
				return "EXPIRED"
			case o.code == "sale_closed":
				return "CLOSED"
			case !busy(o.status) || attempt >= 5 || ctx.Err() != nil:
				return "REJECTED"
			}
			time.Sleep(200 * time.Millisecond) // the same token again: a replay, never a second unit
		}
	default: // RESERVED, EXPIRED, SOLD_OUT, CLOSED
		return status
	}
}

// saleFigures measures the sale's outcome for the comparison: from the
// reserve outcomes (a flash sale: each buyer's last answer is its end) or
// the waiters' ends (the room).
func saleFigures(outs []outcome, ws []*waiter, rep *Report) SaleFigures {
	f := SaleFigures{Attempts: len(outs), Sold: rep.ConfirmedUnits}
	var lastHold time.Time
	for _, o := range outs {
		if at := o.start.Add(o.latency); o.status == http.StatusAccepted && at.After(lastHold) {
			lastHold = at
		}
	}
	var soldOut []time.Time
	if ws != nil {
		f.Buyers = len(ws)
		for _, w := range ws {
			if w.end != "RESERVED" {
				f.Unserved++
			}
			if w.end == "SOLD_OUT" {
				soldOut = append(soldOut, w.endAt)
			}
		}
	} else {
		last := map[string]outcome{}
		for _, o := range outs {
			last[o.user] = o
		}
		f.Buyers = len(last)
		for _, o := range last {
			if o.status != http.StatusAccepted {
				f.Unserved++
			}
			if o.code == "sold_out" {
				soldOut = append(soldOut, o.start.Add(o.latency))
			}
		}
	}
	var lags []time.Duration
	for _, at := range soldOut {
		lags = append(lags, max(0, at.Sub(lastHold)))
	}
	f.SoldOutLag = percentiles(lags)
	if f.Unserved > 0 {
		f.Unsold = rep.Final.MySQLAvailable
	}
	return f
}

// roomFigures counts the waiters' polls and ends, and holds the admissions
// against queue order: by position, Redis's admission times never go back,
// and every place ahead of an admitted one was admitted.
func roomFigures(f *RoomFigures, ws []*waiter) {
	f.Ends = map[string]int{}
	type admission struct {
		pos int64
		at  time.Time
	}
	var as []admission
	for _, w := range ws {
		f.Polls += w.polls
		f.PollsClosed += w.closed
		f.TicketLooks += w.looks
		f.Ends[w.end]++
		if !w.admitted.IsZero() {
			as = append(as, admission{w.position, w.admitted})
		}
	}
	sort.Slice(as, func(i, j int) bool { return as[i].pos < as[j].pos })
	f.Admitted = len(as)
	for i, a := range as {
		if i > 0 && a.at.Before(as[i-1].at) {
			f.Inversions++
		}
	}
	if len(as) > 0 {
		f.Gaps = int(as[len(as)-1].pos) - len(as) // the places 1 … the last admitted no admission was seen of
	}
}

// Print writes both runs' reports and the figures side by side.
func (c *Comparison) Print(w io.Writer) {
	fmt.Fprintf(w, "\nwithout the waiting room:")
	c.Direct.Print(w)
	fmt.Fprintf(w, "\nwith the waiting room:")
	c.Room.Print(w)
	d, r := c.Direct.Sale, c.Room.Sale
	fmt.Fprintf(w, "\nthe same sale, %d buyers for %d units           %14s %14s\n", r.Buyers, c.Room.Stock, "without room", "with room")
	fmt.Fprintf(w, "  reserve attempts per unit sold                  %14.2f %14.2f\n", d.AttemptsPerUnit(), r.AttemptsPerUnit())
	fmt.Fprintf(w, "  last unit's hold → SOLD_OUT, p99               %14v %14v\n", Round(d.SoldOutLag.P99), Round(r.SoldOutLag.P99))
	fmt.Fprintf(w, "  units unsold while buyers waited                %14d %14d\n", d.Unsold, r.Unsold)
	for _, l := range c.Figures() {
		fmt.Fprintln(w, "  "+l)
	}
	verdict := "PASS"
	if !c.Passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "  %s  both runs' checks\n", verdict)
}

// Figures are the comparison's five figures, each as "<figure> = <value>
// (goal …)": make bench's summary prints them.
func (c *Comparison) Figures() []string {
	d, r, f := c.Direct.Sale, c.Room.Sale, c.Room.Room
	out := []string{
		fmt.Sprintf("waiting room: reserve attempts per unit sold = %.2f with the room, %.2f without (goal ≤ 1.5 with the room; %d buyers for %d units)",
			r.AttemptsPerUnit(), d.AttemptsPerUnit(), r.Buyers, c.Room.Stock),
		fmt.Sprintf("waiting room: last unit's hold → every waiter's SOLD_OUT p99 = %v with the room, %v without (goal ≤ 2 s)",
			Round(r.SoldOutLag.P99), Round(d.SoldOutLag.P99)),
		fmt.Sprintf("waiting room: units left unsold while buyers waited = %d with the room, %d without (goal 0)", r.Unsold, d.Unsold),
		fmt.Sprintf("waiting room: admissions out of queue order = %d of %d admitted, %d places skipped (goal 0: identical)", f.Inversions, f.Admitted, f.Gaps),
	}
	if p := f.Cost; p != nil {
		redis, _, mysql := p.PerPoll()
		out = append(out, fmt.Sprintf("waiting room: Redis commands / MySQL statements per poll = %.4f / %.4f (goal ≤ 1 and 0; %d polls in %v: Redis counted %d commands, %d of them scripts, MySQL %d statements, everyone's; %d and %d in as long an idle while before)",
			redis, mysql, p.Polls, Round(p.Duration), p.Counted.RedisCommands, p.Counted.RedisScripts, p.Counted.MySQLStatements, p.Idle.RedisCommands, p.Idle.MySQLStatements))
	} else {
		out = append(out, "waiting room: Redis commands / MySQL statements per poll not measured: "+f.CostSkipped)
	}
	return out
}
