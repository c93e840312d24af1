// Package loadgen fires a flash sale at a holdfast API — many buyers on one
// hot SKU, and optionally group-buy rounds with duplicate joiners — waits
// until the pipeline settles, and reports whether the promise held: no
// oversell, conservation of stock, every accepted reservation final, group
// capacity respected. It speaks only HTTP, so it works against `make dev`
// and against a deployed stage alike.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
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
	Sign     func(*http.Request) error
	Progress io.Writer // progress bar; nil for none
	Client   *http.Client
}

// outcome of one request.
type outcome struct {
	start   time.Time
	latency time.Duration
	status  int
	code    string // error code of a 4xx/5xx
	id      string
	user    string
	group   string
}

// Percentiles of a latency distribution.
type Percentiles struct {
	P50, P90, P99, Max time.Duration
	N                  int
}

// GroupResult is one group-buy round.
type GroupResult struct {
	ID            string
	Capacity      int
	Joins         int // requests
	Accepted      int
	DistinctUsers int // among accepted joins
	Status        string
	Members       int // confirmed members (MySQL)
}

// Check is one PASS/FAIL line of the invariant report.
type Check struct {
	Name   string
	Pass   bool
	Detail string
}

// Bucket is one slice of the timeline.
type Bucket struct {
	At       time.Duration
	Width    time.Duration
	Accepted int
	P99      time.Duration
}

// StockView is GET /admin/skus/{sku}/stock.
type StockView struct {
	MySQLAvailable int64 `json:"mysql_available"`
	RedisAvailable int64 `json:"redis_available"`
	Held           int64 `json:"held"`
	Drift          int64 `json:"drift"`
	Version        int64 `json:"version"`
}

// Report is what a run measured and checked.
type Report struct {
	SKU            string
	Stock          int
	Requests       int
	Accepted       int
	SoldOut        int
	Rejected       int // other 4xx
	Failed         int // 5xx and transport errors
	Confirmed      int // reservations of the hot SKU
	ConfirmedUnits int
	Cancelled      map[string]int // by reason
	Pending        int            // accepted but not final when the wait ended
	Final          StockView
	GroupSKU       string
	GroupStock     int
	GroupFinal     StockView
	GroupUnits     int // confirmed units of group joins
	Groups         []GroupResult
	Duration       time.Duration
	Throughput     float64 // requests/s
	Latency        Percentiles
	Lag            Percentiles // accept → seen CONFIRMED (polling resolution)
	Timeline       []Bucket
	Checks         []Check

	lags []time.Duration // every accept → CONFIRMED lag, for the chart
}

// Passed reports whether every check passed.
func (r *Report) Passed() bool {
	for _, c := range r.Checks {
		if !c.Pass {
			return false
		}
	}
	return len(r.Checks) > 0
}

type runner struct {
	cfg    Config
	client *http.Client

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
	if cfg.N < 1 || cfg.Concurrency < 1 || cfg.Stock < 0 {
		return nil, errors.New("loadgen: N and concurrency must be positive, stock not negative")
	}
	if cfg.GroupCapacity < 2 {
		cfg.GroupCapacity = 3
	}
	if cfg.Settle == 0 {
		cfg.Settle = 2 * time.Minute
	}
	r := &runner{cfg: cfg, client: cfg.Client, tokens: map[string]*userToken{}}
	if r.client == nil {
		r.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency}}
	}
	rep := &Report{SKU: cfg.SKU, Stock: cfg.Stock, Cancelled: map[string]int{}}
	if err := r.setStock(ctx, cfg.SKU, cfg.Stock); err != nil {
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
	start := time.Now()
	outs := r.fire(ctx, start)
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

	var lat []time.Duration
	for _, o := range outs {
		lat = append(lat, o.latency)
		switch {
		case o.status == http.StatusAccepted:
			rep.Accepted++
		case o.code == "sold_out":
			rep.SoldOut++
		case o.status >= 400 && o.status < 500:
			rep.Rejected++
		default:
			rep.Failed++
		}
	}
	rep.Latency = percentiles(lat)
	rep.Timeline = timeline(outs, start)

	lags, pending, err := r.settle(ctx, append(append([]outcome{}, outs...), joins...), rep)
	if err != nil {
		return nil, err
	}
	rep.Pending = pending
	rep.Lag = percentiles(lags)
	rep.lags = lags
	if rep.Final, err = r.stock(ctx, cfg.SKU); err != nil {
		return nil, err
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
		}
	}
	rep.Checks = checks(rep)
	return rep, nil
}

// buyer names the simulated buyer i of the hot SKU; groupUser the j-th
// joiner of group round g (j = 0 opens the group).
func buyer(i int) string        { return fmt.Sprintf("buyer-%d", i) }
func groupUser(g, j int) string { return fmt.Sprintf("g%d-user-%d", g, j) }

// token returns user's bearer token: TokenFor's, obtained once per user, or
// the one static Token.
func (r *runner) token(user string) (string, error) {
	if r.cfg.TokenFor == nil {
		return r.cfg.Token, nil
	}
	r.mu.Lock()
	t, ok := r.tokens[user]
	if !ok {
		t = &userToken{}
		r.tokens[user] = t
	}
	r.mu.Unlock()
	t.once.Do(func() {
		t.tok, t.err = r.cfg.TokenFor(user)
		if t.err == nil && t.tok == "" {
			t.err = errors.New("empty token")
		}
		if t.err != nil {
			t.err = fmt.Errorf("loadgen: token for %s: %w", user, t.err)
		}
	})
	return t.tok, t.err
}

// mintTokens gets every simulated user's token before the clock starts, so
// minting (or a token command) is not measured as the API's latency.
func (r *runner) mintTokens(ctx context.Context) error {
	if r.cfg.TokenFor == nil {
		return nil
	}
	users := make([]string, 0, r.cfg.N+r.cfg.Groups*(r.cfg.GroupCapacity+1))
	for i := range r.cfg.N {
		users = append(users, buyer(i))
	}
	for g := range r.cfg.Groups {
		for j := range r.cfg.GroupCapacity + 1 {
			users = append(users, groupUser(g, j))
		}
	}
	start := time.Now()
	var next, done atomic.Int64
	var failed atomic.Pointer[error]
	stop := make(chan struct{})
	if r.cfg.Progress != nil {
		go progress(r.cfg.Progress, "tokens ", &done, len(users), start, stop)
	}
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(users) || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				if _, err := r.token(users[i]); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if r.cfg.Progress != nil {
		progressLine(r.cfg.Progress, "tokens ", int(done.Load()), len(users), start)
		fmt.Fprintln(r.cfg.Progress)
	}
	if err := failed.Load(); err != nil {
		return *err
	}
	return ctx.Err()
}

// do sends a buyer request as user (with user's token), or an admin request
// (signed by Sign) when user is "".
func (r *runner) do(ctx context.Context, method, path string, body any, user string) (int, map[string]any, error) {
	return r.doWith(ctx, method, path, body, user, nil)
}

func (r *runner) doWith(ctx context.Context, method, path string, body any, user string, headers map[string]string) (int, map[string]any, error) {
	var rd io.Reader
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(r.cfg.BaseURL, "/")+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if user == "" {
		if r.cfg.Sign != nil {
			if err := r.cfg.Sign(req); err != nil {
				return 0, nil, err
			}
		}
	} else {
		tok, err := r.token(user)
		if err != nil {
			return 0, nil, err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, nil
}

func (r *runner) setStock(ctx context.Context, sku string, n int) error {
	// An existing SKU's figure is set against the version read just before
	// (the admin API's precondition); a new one needs none.
	var headers map[string]string
	if v, err := r.stock(ctx, sku); err == nil {
		headers = map[string]string{"If-Match": fmt.Sprintf("%q", fmt.Sprint(v.Version))}
	}
	code, body, err := r.doWith(ctx, http.MethodPut, "/admin/skus/"+sku+"/stock", map[string]any{"stock": n}, "", headers)
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("set stock of %s: %d %v %v", sku, code, body, err)
	}
	return nil
}

func (r *runner) stock(ctx context.Context, sku string) (StockView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.cfg.BaseURL, "/")+"/admin/skus/"+sku+"/stock", nil)
	if err != nil {
		return StockView{}, err
	}
	if r.cfg.Sign != nil {
		if err := r.cfg.Sign(req); err != nil {
			return StockView{}, err
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return StockView{}, err
	}
	defer resp.Body.Close()
	var v StockView
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("stock of %s: %s", sku, resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

type groupView struct {
	Status  string `json:"status"`
	Members int    `json:"members"`
}

// group reads group round g (id) as the user who opened it.
func (r *runner) group(ctx context.Context, g int, id string) (groupView, error) {
	code, body, err := r.do(ctx, http.MethodGet, "/groups/"+id, nil, groupUser(g, 0))
	if err != nil || code != http.StatusOK {
		return groupView{}, fmt.Errorf("group %s: %d %v", id, code, err)
	}
	members, _ := body["members"].(float64)
	status, _ := body["status"].(string)
	return groupView{Status: status, Members: int(members)}, nil
}

func (r *runner) reserve(ctx context.Context, sku, user, group string) outcome {
	body := map[string]any{"sku": sku, "qty": 1}
	if r.cfg.TokenFor == nil {
		body["user_id"] = user // today's API without per-user tokens
	}
	if group != "" {
		body["group_id"] = group
	}
	o := outcome{start: time.Now(), user: user, group: group}
	code, resp, err := r.do(ctx, http.MethodPost, "/reservations", body, user)
	o.latency = time.Since(o.start)
	o.status = code
	if err != nil {
		o.code = "transport"
		return o
	}
	if code == http.StatusAccepted {
		o.id, _ = resp["reservation_id"].(string)
	} else {
		o.code, _ = resp["error"].(string)
	}
	return o
}

// fire sends N reservations for distinct users at the configured concurrency.
func (r *runner) fire(ctx context.Context, start time.Time) []outcome {
	outs := make([]outcome, r.cfg.N)
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
				outs[i] = r.reserve(ctx, r.cfg.SKU, buyer(i), "")
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
// accept → CONFIRMED lags and how many were still pending.
func (r *runner) settle(ctx context.Context, outs []outcome, rep *Report) ([]time.Duration, int, error) {
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
				switch {
				case err != nil || code != http.StatusOK || (status != "CONFIRMED" && status != "CANCELLED"):
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
					reason, _ := body["reason"].(string)
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
			return nil, 0, err
		}
		if v.Held == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return lags, len(pending), nil
}

func checks(rep *Report) []Check {
	var cs []Check
	add := func(name string, pass bool, format string, args ...any) {
		cs = append(cs, Check{Name: name, Pass: pass, Detail: fmt.Sprintf(format, args...)})
	}
	add("no oversell", rep.Final.MySQLAvailable >= 0 && rep.ConfirmedUnits <= rep.Stock,
		"confirmed %d of %d units, MySQL available %d", rep.ConfirmedUnits, rep.Stock, rep.Final.MySQLAvailable)
	add("conservation", int64(rep.Stock) == rep.Final.MySQLAvailable+int64(rep.ConfirmedUnits) &&
		rep.Final.Drift == 0 && rep.Final.Held == 0 && rep.Final.RedisAvailable == rep.Final.MySQLAvailable,
		"stock %d = MySQL available %d + confirmed %d; Redis %d, held %d, drift %d",
		rep.Stock, rep.Final.MySQLAvailable, rep.ConfirmedUnits, rep.Final.RedisAvailable, rep.Final.Held, rep.Final.Drift)
	add("every accepted reservation final", rep.Pending == 0, "%d still HELD", rep.Pending)
	if len(rep.Groups) > 0 {
		ok := int64(rep.GroupStock) == rep.GroupFinal.MySQLAvailable+int64(rep.GroupUnits) && rep.GroupFinal.Held == 0
		detail := []string{fmt.Sprintf("group stock %d = MySQL %d + confirmed %d", rep.GroupStock, rep.GroupFinal.MySQLAvailable, rep.GroupUnits)}
		for _, g := range rep.Groups {
			if g.Accepted > g.Capacity || g.DistinctUsers != g.Accepted || g.Members > g.Capacity {
				ok = false
				detail = append(detail, fmt.Sprintf("%s: %d accepted, %d users, %d members for %d slots", g.ID, g.Accepted, g.DistinctUsers, g.Members, g.Capacity))
			}
		}
		add("group capacity respected", ok, "%s", strings.Join(detail, "; "))
	}
	return cs
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1], N: len(s)}
}

// timeline buckets the requests by start time, about 50 buckets a run
// (at least 5 ms each).
func timeline(outs []outcome, start time.Time) []Bucket {
	var span time.Duration
	for _, o := range outs {
		span = max(span, o.start.Sub(start))
	}
	width := max(5*time.Millisecond, span/50)
	byBucket := map[int][]outcome{}
	last := 0
	for _, o := range outs {
		i := int(o.start.Sub(start) / width)
		byBucket[i] = append(byBucket[i], o)
		last = max(last, i)
	}
	var out []Bucket
	for i := 0; i <= last; i++ {
		b := Bucket{At: time.Duration(i) * width, Width: width}
		var lat []time.Duration
		for _, o := range byBucket[i] {
			lat = append(lat, o.latency)
			if o.status == http.StatusAccepted {
				b.Accepted++
			}
		}
		b.P99 = percentiles(lat).P99
		out = append(out, b)
	}
	return out
}

func progress(w io.Writer, label string, done *atomic.Int64, total int, start time.Time, stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			progressLine(w, label, int(done.Load()), total, start)
		}
	}
}

func progressLine(w io.Writer, label string, done, total int, start time.Time) {
	const width = 40
	filled := width * done / max(total, 1)
	rate := float64(done) / max(time.Since(start).Seconds(), 1e-9)
	fmt.Fprintf(w, "\r%s [%s%s] %d/%d %6.0f req/s", label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, rate)
}

// Print writes the report as a person reads it.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\nholdfast load report — sku %s, %d units\n", r.SKU, r.Stock)
	fmt.Fprintf(w, "  requests %d in %v (%.0f req/s): accepted %d, sold out %d, rejected %d, failed %d\n",
		r.Requests, r.Duration.Round(time.Millisecond), r.Throughput, r.Accepted, r.SoldOut, r.Rejected, r.Failed)
	fmt.Fprintf(w, "  latency  p50 %v  p90 %v  p99 %v  max %v\n", r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	fmt.Fprintf(w, "  decided  confirmed %d (%d units)", r.Confirmed, r.ConfirmedUnits)
	reasons := make([]string, 0, len(r.Cancelled))
	for k := range r.Cancelled {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for _, k := range reasons {
		fmt.Fprintf(w, ", cancelled %s %d", k, r.Cancelled[k])
	}
	fmt.Fprintf(w, ", pending %d\n", r.Pending)
	fmt.Fprintf(w, "  accept → CONFIRMED  p50 %v  p90 %v  p99 %v  max %v (100 ms polling)\n", r.Lag.P50, r.Lag.P90, r.Lag.P99, r.Lag.Max)
	fmt.Fprintf(w, "  stock    Redis available %d, MySQL available %d, live holds %d, drift %d\n",
		r.Final.RedisAvailable, r.Final.MySQLAvailable, r.Final.Held, r.Final.Drift)
	for _, g := range r.Groups {
		fmt.Fprintf(w, "  group %s: %d joins, %d accepted (%d users) for %d slots, %s with %d members\n",
			g.ID, g.Joins, g.Accepted, g.DistinctUsers, g.Capacity, g.Status, g.Members)
	}
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s — %s\n", verdict, c.Name, c.Detail)
	}
}
