// Package loadgen fires a flash sale at a holdfast API — many buyers on one
// hot SKU, and optionally group-buy rounds with duplicate joiners — waits
// until the pipeline settles, and reports whether the promise held: no
// oversell, conservation of stock, every accepted reservation final, group
// capacity respected — and, given the queue the events reach, that every
// outcome's event was published, once in content, none missing, none extra.
// Compare sells the same sale twice, without and with a waiting room
// (room.go), and measures what the room changes.
// It speaks HTTP to the API (and SQS to that queue), so it works against
// `make dev` and against a deployed stage alike.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Config of one run.
type Config struct {
	BaseURL       string
	N             int // reservations to fire at the hot SKU
	Concurrency   int
	SKU           string
	Stock         int // units of the hot SKU
	Groups        int // group-buy rounds (0: none)
	GroupCapacity int
	Settle        time.Duration // how long to wait for every reservation to be decided
	// OpenAfter opens the hot SKU's sale this long after the buyers start
	// (its sale window's opens_at, by the server's clock); 0 opens it at
	// once. A buyer told not_open waits for the opening and tries again.
	OpenAfter time.Duration
	// TokenFor returns the bearer token of one buyer (its JWT's sub is the
	// user); each buyer's requests carry their own. It is called once per
	// user, before the timed phase for the simulated buyers, and the token is
	// kept for the run. With it, reservations name no user_id: the user comes
	// from the token.
	TokenFor func(user string) (string, error)
	// Token, without TokenFor, is one bearer token for every buyer request,
	// which then names its user in user_id.
	Token string
	// Sign, when set, signs admin requests (SigV4 for a deployed stage's IAM routes).
	Sign func(*http.Request) error
	// Events is the queue the run's events reach (make dev's events
	// queue, or a queue of its own a rule of the bus delivers to: never
	// a consumer's); nil skips the events check, for the reason EventsSkip
	// gives. The run deletes its own events from it and leaves every other
	// message there.
	Events     EventQueue
	EventsSkip string
	// EventsWait bounds the wait for the events once the sale settled
	// (default 2 min: the sweeper's drain, once a minute, publishes what a
	// decider's own publish missed).
	EventsWait time.Duration
	Progress   io.Writer // progress bar; nil for none
	Client     *http.Client
	// AdmitFactor is the waiting room's admit factor (Compare's room run:
	// buyers admitted per unit left, 1–100; 0 is 1).
	AdmitFactor float64
	// Counters reads the servers' own counts of work (Redis's commands,
	// MySQL's statements) around the room run's burst of polls; nil skips
	// that figure, for the reason CountersSkip gives. PollBurst is how long
	// the burst lasts (default 3 s).
	Counters     Counters
	CountersSkip string
	PollBurst    time.Duration
}

// outcome of one request.
type outcome struct {
	start   time.Time
	latency time.Duration
	status  int
	code    string // error code of a 4xx/5xx
	id      string
	sku     string
	user    string
	group   string
}

type runner struct {
	cfg    Config
	client *http.Client
	// opens is when the sale opens by this machine's clock (zero: open),
	// skew the uncertainty of that reading (the server-time probe's round trip).
	opens time.Time
	skew  time.Duration

	mu     sync.Mutex
	tokens map[string]*userToken
}

// userToken is one user's token, obtained once.
type userToken struct {
	once sync.Once
	tok  string
	err  error
}

// Run performs a whole run: set up the stock, fire, settle, check.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	r, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	return r.sale(ctx, false)
}

// newRunner checks cfg and fills in its defaults.
func newRunner(cfg Config) (*runner, error) {
	if cfg.N < 1 || cfg.Concurrency < 1 || cfg.Stock < 0 {
		return nil, errors.New("loadgen: N and concurrency must be positive, stock not negative")
	}
	if cfg.GroupCapacity < 2 {
		cfg.GroupCapacity = 3
	}
	if cfg.Settle == 0 {
		cfg.Settle = 2 * time.Minute
	}
	if cfg.EventsWait == 0 {
		cfg.EventsWait = 2 * time.Minute
	}
	r := &runner{cfg: cfg, client: cfg.Client, tokens: map[string]*userToken{}}
	if r.client == nil {
		r.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency}}
	}
	return r, nil
}

// sale is one sale of the hot SKU: the flash sale (every buyer reserves at
// once), or through its waiting room (room: every buyer queues first).
func (r *runner) sale(ctx context.Context, room bool) (*Report, error) {
	cfg := r.cfg
	rep := &Report{SKU: cfg.SKU, Stock: cfg.Stock, Cancelled: map[string]int{}}
	began := time.Now() // every decision of the run comes after
	var err error
	if room {
		err = r.setRoomStock(ctx, cfg.SKU, cfg.Stock)
	} else {
		err = r.setStock(ctx, cfg.SKU, cfg.Stock)
	}
	if err != nil {
		return nil, err
	}
	if cfg.Groups > 0 {
		rep.GroupSKU = cfg.SKU + "-grp"
		rep.GroupStock = cfg.Groups * cfg.GroupCapacity * 2
		if err := r.setStock(ctx, rep.GroupSKU, rep.GroupStock); err != nil {
			return nil, err
		}
	}

	if err := r.mintTokens(ctx); err != nil {
		return nil, err
	}
	var ws []*waiter
	if room {
		if ws, err = r.queueUp(ctx, rep); err != nil {
			return nil, err
		}
	}
	if cfg.OpenAfter > 0 || room {
		if err := r.openLater(ctx, cfg.SKU, max(cfg.OpenAfter, time.Second)); err != nil {
			return nil, err
		}
		rep.OpensAt = r.opens
	}
	start := time.Now()
	var outs []outcome
	if room {
		outs = r.wait(ctx, ws, start)
	} else {
		outs = r.fire(ctx, start)
	}
	var joins []outcome
	if cfg.Groups > 0 {
		var err error
		if joins, rep.Groups, err = r.groupRounds(ctx, rep.GroupSKU); err != nil {
			return nil, err
		}
	}
	rep.Duration = time.Since(start)
	rep.Requests = len(outs)
	rep.Throughput = float64(len(outs)) / rep.Duration.Seconds()

	unanswered := r.tally(rep, outs, joins, start)

	lags, decisions, err := r.settle(ctx, append(append([]outcome{}, outs...), joins...), rep)
	if err != nil {
		return nil, err
	}
	for _, d := range decisions {
		if d.undecided() {
			rep.Pending++
		}
	}
	rep.Lag = percentiles(lags)
	rep.lags = lags
	if rep.Final, err = r.stock(ctx, cfg.SKU); err != nil {
		return nil, err
	}
	rep.Sale = saleFigures(outs, ws, rep)
	if room {
		roomFigures(rep.Room, ws)
	}
	if cfg.Groups > 0 {
		if rep.GroupFinal, err = r.stock(ctx, rep.GroupSKU); err != nil {
			return nil, err
		}
		for i := range rep.Groups {
			g, err := r.group(ctx, i, rep.Groups[i].ID)
			if err != nil {
				return nil, err
			}
			rep.Groups[i].Status, rep.Groups[i].Members = g.Status, g.Members
			decisions = append(decisions, decision{group: true, id: rep.Groups[i].ID, status: g.Status, sku: rep.GroupSKU})
		}
	}
	if cfg.Events == nil {
		rep.Events = &EventsReport{Skipped: cfg.EventsSkip}
		if rep.Events.Skipped == "" {
			rep.Events.Skipped = "no events queue given"
		}
	} else {
		scope := newScope(decisions, []string{cfg.SKU, rep.GroupSKU}, began, unanswered)
		rep.Events = readEvents(ctx, cfg.Events, decisions, scope, time.Now().Add(cfg.EventsWait))
	}
	rep.Checks = checks(rep)
	return rep, nil
}

// tally counts the answers of the sale's reserve attempts (outs) into
// rep, and returns the buyers a reservation of whom may exist unseen
// (answered 5xx or not at all, joins included).
func (r *runner) tally(rep *Report, outs, joins []outcome, start time.Time) map[string]bool {
	var lat []time.Duration
	unanswered := map[string]bool{} // buyers a reservation of whom may exist unseen
	for _, o := range append(append([]outcome{}, outs...), joins...) {
		if o.status == 0 || o.status >= 500 {
			unanswered[o.user] = true
		}
	}
	for _, o := range outs {
		lat = append(lat, o.latency)
		switch {
		case o.status == http.StatusAccepted:
			rep.Accepted++
		case o.code == "sold_out":
			rep.SoldOut++
		case o.code == "not_open":
			rep.NotOpen++
		case o.status >= 400 && o.status < 500:
			rep.Rejected++
		default:
			rep.Failed++
		}
	}
	rep.Latency = percentiles(lat)
	rep.Timeline = timeline(outs, start)
	if !r.opens.IsZero() {
		rep.Opened = r.opens.Sub(start)
		for _, o := range outs {
			done := o.start.Add(o.latency)
			if o.status != http.StatusAccepted {
				continue
			}
			if done.Before(r.opens.Add(-r.skew)) {
				rep.EarlyAccepted++
			}
			if !done.Before(r.opens) && done.Before(r.opens.Add(time.Second)) {
				rep.FirstSecond++
			}
		}
	}
	return unanswered
}

// buyer names the simulated buyer i of the hot SKU; groupUser the j-th
// joiner of group round g (j = 0 opens the group).
func buyer(i int) string { return fmt.Sprintf("buyer-%d", i) }

func groupUser(g, j int) string { return fmt.Sprintf("g%d-user-%d", g, j) }

// openLater sets sku's sale window to open after d by the server's clock,
// read from GET /skus/{sku}'s server_time (as a page counting down does),
// and notes when that is by this machine's clock.
func (r *runner) openLater(ctx context.Context, sku string, d time.Duration) error {
	sent := time.Now()
	code, body, err := r.do(ctx, http.MethodGet, "/skus/"+sku, nil, buyer(0))
	back := time.Now()
	st, _ := body["server_time"].(string)
	server, perr := time.Parse(time.RFC3339Nano, st)
	if err != nil || code != http.StatusOK || perr != nil {
		return fmt.Errorf("loadgen: the server's time from GET /skus/%s: %d %v %v", sku, code, body, err)
	}
	offset := server.Sub(sent.Add(back.Sub(sent) / 2)) // server minus local, at the probe's midpoint
	opens := server.Add(d).UTC().Truncate(time.Millisecond)
	code, body, err = r.do(ctx, http.MethodPut, "/admin/skus/"+sku+"/stock", map[string]any{"add": 0, "opens_at": opens.Format(time.RFC3339Nano)}, "")
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("loadgen: open %s at %s: %d %v %v", sku, opens.Format(time.RFC3339Nano), code, body, err)
	}
	r.opens, r.skew = opens.Add(-offset), back.Sub(sent)
	return nil
}

// buy is buyer i's purchase: until an answer that is not not_open, each
// not_open followed by a wait for the opening (a short pause once it is
// due: this machine's clock may run a little ahead of the server's). Every
// attempt is one outcome.
func (r *runner) buy(ctx context.Context, i int) []outcome {
	var outs []outcome
	for attempt := 0; ; attempt++ {
		o := r.reserve(ctx, r.cfg.SKU, buyer(i), "")
		outs = append(outs, o)
		if o.code != "not_open" || attempt >= 50 || ctx.Err() != nil {
			return outs
		}
		wait := max(time.Until(r.opens), 20*time.Millisecond)
		select {
		case <-ctx.Done():
			return outs
		case <-time.After(wait):
		}
	}
}

// fire sends N reservations for distinct users at the configured concurrency.
func (r *runner) fire(ctx context.Context, start time.Time) []outcome {
	per := make([][]outcome, r.cfg.N)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	if r.cfg.Progress != nil {
		go progress(r.cfg.Progress, "reserve", &done, r.cfg.N, start, stop)
	}
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= r.cfg.N || ctx.Err() != nil {
					return
				}
				per[i] = r.buy(ctx, i)
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if r.cfg.Progress != nil {
		progressLine(r.cfg.Progress, "reserve", int(done.Load()), r.cfg.N, start)
		fmt.Fprintln(r.cfg.Progress)
	}
	var outs []outcome
	for _, o := range per {
		outs = append(outs, o...)
	}
	return outs
}

// groupRounds opens the groups and sends 2 × capacity joins to each, at
// once, from capacity+1 users — so some users join twice.
func (r *runner) groupRounds(ctx context.Context, sku string) ([]outcome, []GroupResult, error) {
	var all []outcome
	var groups []GroupResult
	for g := range r.cfg.Groups {
		code, body, err := r.do(ctx, http.MethodPost, "/groups", map[string]any{"sku": sku, "capacity": r.cfg.GroupCapacity, "ttl_seconds": 3600}, groupUser(g, 0))
		if err != nil || code != http.StatusCreated {
			return nil, nil, fmt.Errorf("create group: %d %v %v", code, body, err)
		}
		id, _ := body["group_id"].(string)
		joins := make([]outcome, 2*r.cfg.GroupCapacity)
		var wg sync.WaitGroup
		for j := range joins {
			wg.Add(1)
			go func() {
				defer wg.Done()
				joins[j] = r.reserve(ctx, sku, groupUser(g, j%(r.cfg.GroupCapacity+1)), id)
			}()
		}
		wg.Wait()
		res := GroupResult{ID: id, Capacity: r.cfg.GroupCapacity, Joins: len(joins)}
		users := map[string]bool{}
		for _, o := range joins {
			if o.status == http.StatusAccepted {
				res.Accepted++
				users[o.user] = true
			}
		}
		res.DistinctUsers = len(users)
		groups = append(groups, res)
		all = append(all, joins...)
	}
	return all, groups, nil
}

// settle polls every accepted reservation until it is CONFIRMED or
// CANCELLED and no hold is left, or the wait runs out. It returns the
// accept → CONFIRMED lags and what it saw decided of each reservation
// (HELD: still pending).
func (r *runner) settle(ctx context.Context, outs []outcome, rep *Report) ([]time.Duration, []decision, error) {
	type pend struct {
		o   outcome
		acc time.Time
	}
	var pending []pend
	for _, o := range outs {
		if o.status == http.StatusAccepted && o.id != "" {
			pending = append(pending, pend{o, o.start.Add(o.latency)})
		}
	}
	deadline := time.Now().Add(r.cfg.Settle)
	var lags []time.Duration
	var decisions []decision
	var mu sync.Mutex
	for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		var still []pend
		sem := make(chan struct{}, r.cfg.Concurrency)
		var wg sync.WaitGroup
		for _, p := range pending {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code, body, err := r.do(ctx, http.MethodGet, "/reservations/"+p.o.id, nil, p.o.user)
				seen := time.Now()
				status, _ := body["status"].(string)
				mu.Lock()
				defer mu.Unlock()
				final := err == nil && code == http.StatusOK && (status == "CONFIRMED" || status == "CANCELLED")
				reason, _ := body["reason"].(string)
				if final {
					decisions = append(decisions, p.o.decision(status, reason))
				}
				switch {
				case !final:
					still = append(still, p)
				case status == "CONFIRMED":
					lags = append(lags, seen.Sub(p.acc))
					if p.o.group != "" {
						rep.GroupUnits++
					} else {
						rep.Confirmed++
						rep.ConfirmedUnits++
					}
				default:
					rep.Cancelled[reason]++
				}
			}()
		}
		wg.Wait()
		pending = still
		if len(pending) > 0 {
			time.Sleep(100 * time.Millisecond) // the next polling round; a client polls the same way
		}
	}
	// Holds of cancelled reservations go back within the same decisions;
	// wait (bounded) until Redis has no hold left.
	for time.Now().Before(deadline) && ctx.Err() == nil {
		v, err := r.stock(ctx, r.cfg.SKU)
		if err != nil {
			return nil, nil, err
		}
		if v.Held == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range pending {
		decisions = append(decisions, p.o.decision("HELD", ""))
	}
	return lags, decisions, nil
}

// decision is what the run saw of o's reservation: status (and reason).
func (o outcome) decision(status, reason string) decision {
	return decision{id: o.id, status: status, reason: reason, sku: o.sku, user: o.user, qty: 1, gid: o.group}
}
