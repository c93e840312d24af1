package loadgen

// What a run found: the report, its checks against the promise, and how it prints.

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

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
	Requests int // requests started in the bucket; 0 leaves P99 undefined (a gap)
	Accepted int
	SoldOut  int
	NotOpen  int
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
	NotOpen        int // not_open answers (before the sale opened)
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
	// With Config.OpenAfter: when the sale opened (this machine's clock),
	// and after the run's start; accepted answers in its first second, and
	// any that came back before it opened (beyond the clock's uncertainty).
	OpensAt       time.Time
	Opened        time.Duration
	FirstSecond   int
	EarlyAccepted int
	// Events is the events check: what the run's decisions published,
	// against the decisions (Skipped says why it did not run).
	Events *EventsReport
	// Sale is what the waiting room changes (reserve attempts per unit,
	// SOLD_OUT after the last hold, units unsold), measured in any run;
	// Room the room run's own figures (nil: a flash sale).
	Sale SaleFigures
	Room *RoomFigures

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
	switch {
	case rep.Room != nil:
		add("nothing sold before the sale opened", rep.EarlyAccepted == 0 && rep.Room.PollsClosed > 0,
			"%d polls answered before it opened, %d accepted before", rep.Room.PollsClosed, rep.EarlyAccepted)
	case !rep.OpensAt.IsZero():
		add("nothing sold before the sale opened", rep.EarlyAccepted == 0 && rep.NotOpen > 0,
			"%d not_open answers before it opened, %d accepted before", rep.NotOpen, rep.EarlyAccepted)
	}
	if f := rep.Room; f != nil {
		add("admitted in queue order", f.Admitted > 0 && f.Inversions == 0 && f.Gaps == 0,
			"%d tickets admitted: %d admitted before one ahead of them, %d places skipped", f.Admitted, f.Inversions, f.Gaps)
		add("no unit unsold while buyers waited", rep.Sale.Unsold == 0,
			"%d buyers ended without a unit, %d units unsold", rep.Sale.Unserved, rep.Sale.Unsold)
		add("every waiter's sale ended", f.Ends["GAVE_UP"] == 0 && f.Ends["REJECTED"] == 0 && f.Joined == rep.Sale.Buyers,
			"%d joined: %s", f.Joined, ends(f.Ends))
	}
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
	if e := rep.Events; e != nil && e.Skipped == "" {
		detail := fmt.Sprintf("%d decisions, %d events: %d missing, %d extra", e.Decisions, e.Events, len(e.Missing), len(e.Extra))
		if len(e.Missing) > 0 {
			detail += "; missing " + sample(e.Missing)
		}
		if len(e.Extra) > 0 {
			detail += "; extra " + sample(e.Extra)
		}
		if e.Err != nil {
			detail += "; reading " + e.Queue + ": " + e.Err.Error()
		}
		add("every outcome's event", len(e.Missing) == 0 && len(e.Extra) == 0 && e.Err == nil, "%s", detail)
	}
	return cs
}

// sample lists the first few of xs, and how many more there are.
func sample(xs []string) string {
	const shown = 3
	s := strings.Join(xs[:min(shown, len(xs))], ", ")
	if len(xs) > shown {
		s += fmt.Sprintf(" and %d more", len(xs)-shown)
	}
	return s
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
			b.Requests++
			if o.status == http.StatusAccepted {
				b.Accepted++
			}
			switch o.code {
			case "sold_out":
				b.SoldOut++
			case "not_open":
				b.NotOpen++
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

// progressLine draws label's bar; the rate is in label per second
// ("tokens/s" while minting, "reserve/s" while reserving).
func progressLine(w io.Writer, label string, done, total int, start time.Time) {
	const width = 40
	filled := width * done / max(total, 1)
	rate := float64(done) / max(time.Since(start).Seconds(), 1e-9)
	fmt.Fprintf(w, "\r%s [%s%s] %d/%d %6.0f %s/s", label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, rate, strings.TrimSpace(label))
}

// Round returns d as a person reads it: 28.8ms, 412µs, 1.52s (three
// significant digits at most, never nanoseconds).
func Round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// Print writes the report as a person reads it.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\nholdfast load report — sku %s, %d units\n", r.SKU, r.Stock)
	fmt.Fprintf(w, "  requests %d in %v (%.0f req/s): accepted %d, sold out %d, rejected %d, failed %d\n",
		r.Requests, r.Duration.Round(time.Millisecond), r.Throughput, r.Accepted, r.SoldOut, r.Rejected, r.Failed)
	fmt.Fprintf(w, "  latency  p50 %v  p90 %v  p99 %v  max %v\n", Round(r.Latency.P50), Round(r.Latency.P90), Round(r.Latency.P99), Round(r.Latency.Max))
	if f := r.Room; f != nil {
		fmt.Fprintf(w, "  room     admit factor %g: %d joined before the opening, %d polls (%d before it opened), %d ticket looks; ends: %s\n",
			f.AdmitFactor, f.Joined, f.Polls, f.PollsClosed, f.TicketLooks, ends(f.Ends))
		fmt.Fprintf(w, "  room     %d admitted, %d out of queue order, %d places skipped\n", f.Admitted, f.Inversions, f.Gaps)
		if c := f.Cost; c != nil {
			redis, scripts, mysql := c.PerPoll()
			fmt.Fprintf(w, "  polls    a burst of %d in %v: Redis counted %d commands (%d scripts: the looks past the edge cache, one each), MySQL %d statements: %.4f, %.4f and %.4f per poll; idle as long before: %d commands, %d statements\n",
				c.Polls, Round(c.Duration), c.Counted.RedisCommands, c.Counted.RedisScripts, c.Counted.MySQLStatements, redis, scripts, mysql,
				c.Idle.RedisCommands, c.Idle.MySQLStatements)
		} else {
			fmt.Fprintf(w, "  polls    cost not measured: %s\n", f.CostSkipped)
		}
	} else if !r.OpensAt.IsZero() {
		fmt.Fprintf(w, "  window   opened %v after the start: %d not_open answers before it; %d accepted/s in its first second\n",
			Round(r.Opened), r.NotOpen, r.FirstSecond)
	}
	if s := r.Sale; s.Buyers > 0 {
		fmt.Fprintf(w, "  sale     %d buyers, %d reserve attempts for %d units sold (%.2f a unit); SOLD_OUT after the last hold p50 %v p99 %v max %v; %d buyers without a unit, %d units unsold\n",
			s.Buyers, s.Attempts, s.Sold, s.AttemptsPerUnit(), Round(s.SoldOutLag.P50), Round(s.SoldOutLag.P99), Round(s.SoldOutLag.Max), s.Unserved, s.Unsold)
	}
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
	fmt.Fprintf(w, "  accept → CONFIRMED  p50 %v  p90 %v  p99 %v  max %v (100 ms polling)\n", Round(r.Lag.P50), Round(r.Lag.P90), Round(r.Lag.P99), Round(r.Lag.Max))
	fmt.Fprintf(w, "  stock    Redis available %d, MySQL available %d, live holds %d, drift %d\n",
		r.Final.RedisAvailable, r.Final.MySQLAvailable, r.Final.Held, r.Final.Drift)
	for _, g := range r.Groups {
		fmt.Fprintf(w, "  group %s: %d joins, %d accepted (%d users) for %d slots, %s with %d members\n",
			g.ID, g.Joins, g.Accepted, g.DistinctUsers, g.Capacity, g.Status, g.Members)
	}
	r.Events.print(w)
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s — %s\n", verdict, c.Name, c.Detail)
	}
}

// ends lists a room's end states and their buyers, in order.
func ends(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// print writes the events lines of the report.
func (e *EventsReport) print(w io.Writer) {
	switch {
	case e == nil:
		return
	case e.Skipped != "":
		fmt.Fprintf(w, "  events   not checked: %s\n", e.Skipped)
		return
	}
	counts := make([]string, 0, len(reservation.EventTypes))
	for _, t := range reservation.EventTypes {
		counts = append(counts, fmt.Sprintf("%s %d", t, e.Counts[t]))
	}
	fmt.Fprintf(w, "  events   %s (from %s in %v: %d messages, %d redelivered; %d not the run's left there)\n",
		strings.Join(counts, ", "), e.Queue, Round(e.Waited), e.Deliveries, e.Redelivered, e.Others)
	if e.ReleaseErr != nil {
		fmt.Fprintf(w, "  events   those left stay hidden %v: %v\n", hideFor, e.ReleaseErr)
	}
	fmt.Fprintf(w, "  events   %d out of order (a later version read first; consumers order by version)", len(e.OutOfOrder))
	if len(e.OutOfOrder) > 0 {
		fmt.Fprintf(w, ": %s", sample(e.OutOfOrder))
	}
	if e.Late > 0 {
		fmt.Fprintf(w, "; %d of reservations still pending", e.Late)
	}
	if e.Unanswered > 0 {
		fmt.Fprintf(w, "; %d of reservations of buyers answered 5xx or not at all", e.Unanswered)
	}
	fmt.Fprintln(w)
}
