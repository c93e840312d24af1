package reservation

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The fakes below are in-memory models of the ports with the same
// contracts as the Redis and MySQL adapters (shared/redisstore with its Lua
// scripts, shared/mysqlstore), plus switches that inject failures. They make
// the protocol's decisions testable in microseconds; the adapters' own
// contract tests and the integration tests check the real stores.

var errInjected = Unavailable("fake", errors.New("injected failure"))

var (
	_ Holds    = (*memHolds)(nil)
	_ Ledger   = (*memLedger)(nil)
	_ Enqueuer = (*memQueue)(nil)
	_ Notifier = (*memNotifier)(nil)
	_ Metrics  = (*memMetrics)(nil)
	_ Clock    = (*fixedClock)(nil)
)

// ---------------------------------------------------------------- Redis

// memHold is the hold hash (hf:{sku}:r:<id>) of reserve.lua and follow.lua.
type memHold struct {
	sku, user, group, token string
	qty                     int64
	state                   Status
	reason                  Reason
	refunded                bool
	rel                     string // the token whose release follow.lua applied (field rel)
	hasRel                  bool   // rel is set (HMGET answers false for a missing field)
	deadline, created       int64  // unix ms; 0 on a tombstone
	bucket                  int    // the bucket the hash is in
	transfer                bool   // a transfer's hold (field into)
	into                    int
	credited                bool // a transfer's mark in the receiving bucket (credit.lua)
	ahead                   bool // the mark's state is AHEAD: credited ahead of the record
	wn                      int64
	landed                  bool // a transfer's units were credited (landed.lua's field landed)
	sent                    bool // a join's message is sent (group_accept.lua's field sent)
	paid                    bool // follow.lua followed it paid (field paid)
}

// reservation mirrors redisstore's holdFromMap: the outboxes are not Redis
// fields.
func (h *memHold) reservation(id string) Reservation {
	r := Reservation{
		ID: id, SKU: h.sku, Qty: int(h.qty), UserID: h.user, GroupID: h.group,
		Token: h.token, Status: h.state, Reason: h.reason,
		Bucket: h.bucket, Transfer: h.transfer, Into: h.into, Sent: h.sent,
	}
	if h.state == StatusCancelled {
		r.Cancellation = Fenced
		if h.refunded {
			r.Cancellation = Refunded
		}
	}
	if h.deadline > 0 {
		r.ExpiresAt = time.UnixMilli(h.deadline).UTC()
	}
	if h.created > 0 {
		r.CreatedAt = time.UnixMilli(h.created).UTC()
	}
	return r
}

// memGroup is the group hash (hf:{sku}:g:<gid>).
type memGroup struct {
	capacity, remaining int
	status              GroupStatus
	deadline, formedAt  int64 // unix ms; formedAt 0 until FORMED
	fullAt              int64 // unix ms when the last slot was taken; 0 until then
}

// memHolds models one Redis: per SKU the stock string, the meta hash (held,
// ver, added, limit, cver, drift, drift_at: a field is absent until written,
// as in Redis), the exp sorted set and the users hash; the hold hashes; the
// group and members hashes. Scripts take their time from clock (WithClock).
type memHolds struct {
	mu      sync.Mutex
	clock   Clock
	stock   map[string]int64             // sku -> available; absent: Redis lost or never had the SKU
	meta    map[string]map[string]int64  // sku -> meta hash (held ver added limit cver wver drift drift_at)
	exp     map[string]map[string]int64  // sku -> id -> deadline (ms)
	users   map[string]map[string]int64  // sku -> user -> units held or confirmed
	holds   map[string]*memHold          // by reservation id (an id names its SKU)
	groups  map[string]*memGroup         // by groupKey
	members map[string]map[string]string // groupKey -> user -> reservation id
	fail    map[string]error             // method -> error returned before anything runs
	lost    map[string]error             // method -> error returned after the script ran (reply lost)
	calls   map[string]int               // method -> calls
	follows []Reservation                // rows Follow was called with, in order
	// rate and burst are the per-user attempt defaults (reserve.lua's ARGV
	// 9 and 10; 0: none); attempts are the users' attempt budgets per SKU
	// bucket.
	rate, burst int
	attempts    map[string]*attempts
	// opened mirrors charge.lua's open-group sorted sets: bucket name and
	// user -> group id -> until (ms).
	opened map[string]map[string]int64
	// live mirrors the sweeper's live sorted set (sku -> the mark's end, ms)
	// and cursor its catalog cursor string.
	live   map[string]int64
	cursor string
	// queues mirror the waiting rooms' keys (queue.lua), by bucket 0's name.
	queues map[string]*memRoom
	// unpaid mirrors each bucket's unpaid hash (id -> qty of the CONFIRMED
	// reservations unpaid within a pay window); meta.unpaid sums it.
	unpaid map[string]map[string]int64
}

// memRoom mirrors a waiting room's keys: the queue (ticket -> place),
// qmeta (seq, through), admitted (ticket -> ms) and done (ticket -> R|L).
type memRoom struct {
	place                         map[string]float64
	seq, through, round, rthrough int64
	base                          float64
	sold                          bool // a look of this round told its waiters SOLD_OUT
	admitted                      map[string]int64
	done                          map[string]string
}

func (m *memHolds) queueOf(name string) *memRoom {
	if m.queues == nil {
		m.queues = map[string]*memRoom{}
	}
	q := m.queues[name]
	if q == nil {
		q = &memRoom{place: map[string]float64{}, admitted: map[string]int64{}, done: map[string]string{}}
		m.queues[name] = q
	}
	return q
}

// order is the queue's tickets in place order (ZRANGE: by score, then member).
func (q *memRoom) order() []string {
	out := make([]string, 0, len(q.place))
	for t := range q.place {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := q.place[out[i]], q.place[out[j]]
		if a != b {
			return a < b
		}
		return out[i] < out[j]
	})
	return out
}

// Queue mirrors queue.lua.
func (m *memHolds) Queue(_ context.Context, sku, ticket string, op QueueOp) (QueueState, error) {
	err := m.enter("Queue")
	defer m.mu.Unlock()
	if err != nil {
		return QueueState{}, err
	}
	name := BucketName(sku, 0)
	now := m.nowMS()
	meta := m.meta[name]
	st := QueueState{SKU: sku, Ticket: ticket, Now: time.UnixMilli(now).UTC(), OpensAt: msTime(meta["opens"]), ClosesAt: msTime(meta["closes"])}
	avail, ok := m.stock[name]
	if !ok {
		return QueueState{}, ErrUnknownSKU
	}
	room, held, opens, closes := meta["room"], meta["held"], meta["opens"], meta["closes"]
	if room <= 0 {
		return st, ErrNoWaitingRoom
	}
	back := max(held, 0) + max(meta["unpaid"], 0) // units that may still return
	if op.Charge != "" {
		if wait := m.charge(name, op.Charge, now); wait > 0 {
			return st, &RateLimitedError{RetryAfter: time.Duration(wait) * time.Millisecond}
		}
	}
	open := opens <= 0 || now >= opens
	closed := closes > 0 && now >= closes
	q := m.queueOf(name)
	if len(q.place) == 0 { // the queue gone: the room starts over
		*q = memRoom{place: q.place, admitted: map[string]int64{}, done: map[string]string{}}
	}
	if _, in := q.place[ticket]; op.Join && !in {
		if opens > 0 && now < opens-op.Lead.Milliseconds() {
			opens := st.OpensAt.Add(-op.Lead)
			return st, &QueueNotOpenError{OpensAt: opens, RetryAfter: opens.Sub(st.Now)}
		}
		if closed {
			return st, ErrSaleClosed
		}
		if q.round != opens { // another opening: a new round past every place, if this one opened
			if q.seq > 0 || q.through > q.rthrough {
				if q.sold { // its waiters were told SOLD_OUT: not carried into the new round
					for _, t := range q.order()[q.through:] {
						delete(q.place, t)
					}
				}
				q.sold = false
				for _, p := range q.place {
					q.base = max(q.base, math.Floor(p)+1)
				}
				q.seq, q.rthrough = 0, q.through
			}
			q.round = opens
		}
		place := q.base + op.Place
		if open {
			q.seq++
			place = q.base + float64(1+q.seq)
		}
		q.place[ticket] = place
	}
	if open { // admissions lapse after the close too
		for t, at := range q.admitted {
			if at <= now-op.AdmitFor.Milliseconds() {
				q.done[t] = "L"
				delete(q.admitted, t)
			}
		}
	}
	if open && !closed {
		units := ((max(avail, 0)+back)*room+999)/1000 - back // math.ceil
		each := max(meta["limit"], 1)                        // an admission's units
		budget := (units+each-1)/each - int64(len(q.admitted))
		order := q.order()
		for ; budget > 0 && q.through < int64(len(order)); budget-- {
			q.admitted[order[q.through]] = now
			q.through++
		}
	}
	if open && avail <= 0 && back <= 0 && q.through < int64(len(q.place)) {
		q.sold = true
	}
	st.Through, st.Length, st.Available, st.Held, st.Unpaid = q.through, int64(len(q.place)), avail, held, meta["unpaid"]
	if ticket != "" {
		if _, in := q.place[ticket]; in {
			rank := int64(slices.Index(q.order(), ticket))
			if open {
				st.Position = rank + 1
			}
			at, admitted := q.admitted[ticket]
			switch d := q.done[ticket]; {
			case d == "R":
				st.State = TicketReserved
			case d == "L", open && rank < q.through && !admitted:
				st.State = TicketExpired
			case admitted:
				st.State, st.AdmittedAt = TicketAdmitted, time.UnixMilli(at).UTC()
			case closed:
				st.State = TicketClosed
			case open && avail <= 0 && back <= 0:
				st.State = TicketSoldOut
			default:
				st.State = TicketWaiting
			}
		}
	}
	return st, nil
}

// msTime is a meta bound (unix ms, 0: none) as a time.
func msTime(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// attempts mirrors budget.lua's attempt budget string (tokens:at:last).
type attempts struct {
	tokens float64
	at     int64
	last   string // the token of the last attempt charge.lua charged
}

func newMemHolds(c Clock) *memHolds {
	return &memHolds{
		clock: c, stock: map[string]int64{}, meta: map[string]map[string]int64{},
		exp: map[string]map[string]int64{}, users: map[string]map[string]int64{},
		holds: map[string]*memHold{}, groups: map[string]*memGroup{}, members: map[string]map[string]string{},
		fail: map[string]error{}, lost: map[string]error{}, calls: map[string]int{},
		attempts: map[string]*attempts{}, opened: map[string]map[string]int64{}, live: map[string]int64{},
	}
}

// charge mirrors budget.lua's spend(): one token per attempt; the wait
// until the next one when there is none (0: charged).
func (m *memHolds) charge(sku, user string, now int64) int64 {
	rate, burst := float64(m.metaOf(sku)["rate"]), float64(m.metaOf(sku)["burst"])
	if rate <= 0 {
		rate = float64(m.rate)
	}
	if burst <= 0 {
		burst = float64(m.burst)
	}
	if rate <= 0 || burst <= 0 {
		return 0
	}
	key := sku + "\x00" + user
	b := m.attempts[key]
	if b == nil {
		b = &attempts{tokens: burst, at: now}
		m.attempts[key] = b
	}
	if now < b.at {
		b.at = now
	}
	b.tokens = min(burst, b.tokens+float64(now-b.at)*rate/1000)
	b.at = now
	if b.tokens < 1 {
		return int64(math.Ceil((1 - b.tokens) * 1000 / rate))
	}
	b.tokens--
	return 0
}

// Charge mirrors charge.lua.
func (m *memHolds) Charge(_ context.Context, a Attempt) error {
	err := m.enter("Charge")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	name, now := BucketName(a.SKU, a.Bucket), m.nowMS()
	key := name + "\x00" + a.UserID
	if a.Group != "" {
		if _, ok := m.opened[key][a.Group]; ok {
			return nil
		}
	}
	if b := m.attempts[key]; a.Token == "" || b == nil || b.last != a.Token {
		if wait := m.charge(name, a.UserID, now); wait > 0 {
			return &RateLimitedError{RetryAfter: time.Duration(wait) * time.Millisecond}
		}
		if b := m.attempts[key]; b != nil {
			b.last = a.Token
		}
	}
	if a.Group == "" {
		return nil
	}
	open := m.opened[key]
	if open == nil {
		open = map[string]int64{}
		m.opened[key] = open
	}
	first := int64(-1)
	for g, until := range open {
		if until <= now {
			delete(open, g)
		} else if first < 0 || until < first {
			first = until
		}
	}
	if a.MaxOpen > 0 && len(open) >= a.MaxOpen {
		return &TooManyGroupsError{RetryAfter: time.Duration(max(1, first-now)) * time.Millisecond}
	}
	open[a.Group] = a.Until.UnixMilli()
	return nil
}

func groupKey(sku, gid string) string { return sku + "\x00" + gid }

// holdKey names the hold hash of id in the bucket named bucket (the id alone
// in bucket 0).
func holdKey(bucket, id string) string {
	if _, b := ParseBucket(bucket); b > 0 {
		return bucket + "\x00" + id
	}
	return id
}

func (m *memHolds) enter(name string) error {
	m.mu.Lock()
	m.calls[name]++
	return m.fail[name]
}

// nowMS is clock.lua's clock_ms: the injected clock's reading.
func (m *memHolds) nowMS() int64 { return m.clock.Now().UnixMilli() }

// metaOf returns the SKU's meta hash, creating it (HINCRBY/HSET create keys).
func (m *memHolds) metaOf(sku string) map[string]int64 {
	if m.meta[sku] == nil {
		m.meta[sku] = map[string]int64{}
	}
	return m.meta[sku]
}

// forget deletes a hold hash only, as retention or a failover would
// (redisstore's export_test Forget).
func (m *memHolds) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holds, id)
}

// forgetStock deletes a SKU's stock figure only (redisstore's ForgetStock).
func (m *memHolds) forgetStock(sku string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.stock, sku)
}

// unpaidAdd and unpaidRemove mirror follow.lua's: the unpaid hash and
// meta.unpaid change together, each once.
func (m *memHolds) unpaidAdd(sku, id string, qty int64) {
	if m.unpaid == nil {
		m.unpaid = map[string]map[string]int64{}
	}
	if m.unpaid[sku] == nil {
		m.unpaid[sku] = map[string]int64{}
	}
	if _, ok := m.unpaid[sku][id]; !ok {
		m.unpaid[sku][id] = qty
		m.metaOf(sku)["unpaid"] += qty
	}
}

func (m *memHolds) unpaidRemove(sku, id string) {
	if n, ok := m.unpaid[sku][id]; ok {
		delete(m.unpaid[sku], id)
		m.metaOf(sku)["unpaid"] -= n
	}
}

// hold returns the hold hash of id, for assertions.
func (m *memHolds) hold(id string) (Reservation, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.holds[id]
	if !ok {
		return Reservation{}, false
	}
	return h.reservation(id), true
}

// unpaidUnits returns meta.unpaid of sku, for assertions.
func (m *memHolds) unpaidUnits(sku string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.meta[sku]["unpaid"]
}

// held returns meta.held of sku, for assertions.
func (m *memHolds) held(sku string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.meta[sku]["held"]
}

// group returns the group hash, for assertions.
func (m *memHolds) group(sku, gid string) (memGroup, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.groups[groupKey(sku, gid)]
	if !ok {
		return memGroup{}, false
	}
	return *g, true
}

// Reserve mirrors reserve.lua (with the clock.lua prelude).
func (m *memHolds) Reserve(_ context.Context, r Reservation, ttl time.Duration) (Reservation, ReserveOutcome, error) {
	err := m.enter("Reserve")
	defer m.mu.Unlock()
	if err != nil {
		return Reservation{}, ReserveOutcome{}, err
	}
	h, out, err := m.reserve(r, ttl)
	if lost := m.lost["Reserve"]; lost != nil {
		return Reservation{}, ReserveOutcome{}, lost
	}
	return h, out, err
}

func (m *memHolds) reserve(r Reservation, ttl time.Duration) (Reservation, ReserveOutcome, error) {
	qty := int64(r.Qty)
	name := BucketName(r.SKU, r.Bucket)
	if h, ok := m.holds[holdKey(name, r.ID)]; ok {
		if h.token != r.Token && !r.AlreadyCharged { // a mismatch is charged too
			if wait := m.charge(name, r.UserID, m.nowMS()); wait > 0 {
				return Reservation{}, ReserveOutcome{}, &RateLimitedError{RetryAfter: time.Duration(wait) * time.Millisecond}
			}
		}
		if h.qty != qty || h.user != r.UserID || h.group != r.GroupID {
			return Reservation{}, ReserveOutcome{}, ErrIdempotencyMismatch
		}
		return h.reservation(r.ID), ReserveOutcome{Replayed: true, Tombstone: h.created == 0}, nil
	}
	if r.AlreadyCharged {
		// the retry of an attempt already charged: no charge (reserve.lua's ARGV[11])
	} else if wait := m.charge(name, r.UserID, m.nowMS()); wait > 0 {
		return Reservation{}, ReserveOutcome{}, &RateLimitedError{RetryAfter: time.Duration(wait) * time.Millisecond}
	}
	avail, ok := m.stock[name]
	if !ok {
		return Reservation{}, ReserveOutcome{}, ErrUnknownSKU
	}
	if opens, now := m.meta[name]["opens"], m.nowMS(); opens > 0 && now < opens {
		return Reservation{}, ReserveOutcome{}, &NotOpenError{OpensAt: time.UnixMilli(opens).UTC(), RetryAfter: time.Duration(opens-now) * time.Millisecond}
	}
	if closes := m.meta[name]["closes"]; closes > 0 && m.nowMS() >= closes {
		return Reservation{}, ReserveOutcome{}, ErrSaleClosed
	}
	room := m.meta[name]["room"] > 0
	if room {
		q := m.queueOf(name)
		if r.Ticket == "" {
			return Reservation{}, ReserveOutcome{}, ErrAdmissionRequired
		}
		if _, ok := q.admitted[r.Ticket]; !ok || m.nowMS() >= r.TicketExpires.UnixMilli() {
			return Reservation{}, ReserveOutcome{}, ErrAdmissionExpired
		}
	}
	if limit := m.meta[name]["limit"]; limit > 0 && m.users[name][r.UserID]+qty > limit {
		return Reservation{}, ReserveOutcome{}, ErrLimitExceeded // before the stock, as in reserve.lua
	}
	if room && m.meta[name]["limit"] <= 0 && qty > 1 {
		return Reservation{}, ReserveOutcome{}, ErrLimitExceeded // an admission is for one unit then
	}
	if avail < qty {
		return Reservation{}, ReserveOutcome{}, ErrSoldOut
	}
	now := m.nowMS()
	var out ReserveOutcome
	if r.GroupID != "" {
		key := groupKey(r.SKU, r.GroupID)
		g, ok := m.groups[key]
		switch {
		case !ok:
			return Reservation{}, ReserveOutcome{}, ErrUnknownGroup
		case g.status == GroupFailed || now >= g.deadline:
			return Reservation{}, ReserveOutcome{}, ErrGroupClosed
		case m.members[key][r.UserID] != "":
			return Reservation{}, ReserveOutcome{}, ErrAlreadyJoined
		case g.status != GroupOpen || g.remaining <= 0:
			return Reservation{}, ReserveOutcome{}, ErrGroupFull
		}
		g.remaining--
		if g.remaining == 0 {
			g.fullAt = now
			out.Full = true
		}
		if m.members[key] == nil {
			m.members[key] = map[string]string{}
		}
		m.members[key][r.UserID] = r.ID
	}
	deadline := now + ttl.Milliseconds()
	if room {
		q := m.queueOf(name)
		delete(q.admitted, r.Ticket)
		q.done[r.Ticket] = "R"
	}
	m.stock[name] -= qty
	m.metaOf(name)["held"] += qty
	if m.users[name] == nil {
		m.users[name] = map[string]int64{}
	}
	m.users[name][r.UserID] += qty
	m.holds[holdKey(name, r.ID)] = &memHold{
		sku: r.SKU, qty: qty, user: r.UserID, group: r.GroupID, token: r.Token,
		state: StatusHeld, deadline: deadline, created: now, bucket: r.Bucket,
	}
	if m.exp[name] == nil {
		m.exp[name] = map[string]int64{}
	}
	m.exp[name][r.ID] = deadline
	r.ExpiresAt, r.CreatedAt, r.Status = time.UnixMilli(deadline).UTC(), time.UnixMilli(now).UTC(), StatusHeld
	return r, out, nil
}

// Follow mirrors follow.lua.
func (m *memHolds) Follow(_ context.Context, row Reservation, version int64) (bool, error) {
	err := m.enter("Follow")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	m.follows = append(m.follows, row)
	returned, pending := m.follow(row, version)
	if lost := m.lost["Follow"]; lost != nil {
		return false, lost
	}
	if pending {
		return false, ErrUnknownSKU
	}
	return returned, nil
}

// follow reports whether stock came back, and pending when a refund needs
// the stock and Redis has none (follow.lua's 2).
func (m *memHolds) follow(row Reservation, version int64) (returned, pending bool) {
	sku, id, token := BucketName(row.SKU, row.Bucket), row.ID, row.Token
	key := holdKey(sku, id)
	qty, user, gid := int64(row.Qty), row.UserID, row.GroupID
	// neverCounted mirrors follow.lua's: the row's join never counted, or
	// its hold expired unsent.
	neverCounted := row.Status == StatusCancelled && !row.Reason.CountsInGroup()
	if h, ok := m.holds[key]; ok && row.Reason == ReasonExpired && h.state == StatusHeld && !h.sent {
		neverCounted = true
	}
	giveBack := func(n int64, who, group string, counted bool) {
		if _, ok := m.stock[sku]; ok && !counted {
			m.stock[sku] += n
		}
		if m.users[sku] == nil {
			m.users[sku] = map[string]int64{}
		}
		if who == "" {
			// a transfer: no per-user units
		} else if m.users[sku][who] -= n; m.users[sku][who] <= 0 {
			delete(m.users[sku], who)
		}
		key := groupKey(sku, gid)
		if g := m.groups[key]; group != "" && group == gid && m.members[key][who] == id && g != nil && g.status == GroupOpen &&
			(m.nowMS() < g.deadline || neverCounted) {
			delete(m.members[key], who)
			g.remaining++
			g.fullAt = 0
		}
	}
	var old memHold // HMGET's answer: the hold before this call
	unhold := func(n int64) {
		m.metaOf(sku)["held"] -= n
		if old.transfer && !old.landed {
			m.metaOf(sku)["moving"] -= n
		}
		delete(m.exp[sku], id)
	}

	var state Status
	if h, ok := m.holds[key]; ok {
		old, state = *h, h.state
	}
	if state != "" && token != "" && old.token != token { // a stray
		if state == StatusHeld {
			unhold(old.qty)
			giveBack(old.qty, old.user, old.group, false)
			// A stray held in another group than the row's frees its slot
			// there while that group is OPEN: MySQL never took it.
			key := groupKey(sku, old.group)
			if g := m.groups[key]; old.group != "" && old.group != gid && m.members[key][old.user] == id && g != nil && g.status == GroupOpen {
				delete(m.members[key], old.user)
				g.remaining++
				g.fullAt = 0
			}
			returned = true
		}
		delete(m.holds, key)
		state = ""
	}
	if _, stocked := m.stock[sku]; row.Cancellation == Refunded && row.Release == ReleaseOwed &&
		(state == StatusConfirmed || state == "") && (state == "" || !old.hasRel || old.rel != token) && !stocked {
		return returned, true
	}
	paid := !row.PaidAt.IsZero()
	if row.Status == StatusCancelled || paid {
		m.unpaidRemove(sku, id)
	}
	if row.Status == StatusConfirmed && !paid && !row.PayBy.IsZero() &&
		(state == StatusHeld || state == "" || (state == StatusConfirmed && !old.paid)) {
		m.unpaidAdd(sku, id, qty)
	}
	if state == "" { // the row's tombstone
		m.holds[key] = &memHold{sku: row.SKU, qty: qty, user: user, group: gid, token: token, state: row.Status,
			bucket: row.Bucket, transfer: row.Transfer, into: row.Into}
	}
	h := m.holds[key]

	if row.Status == StatusConfirmed {
		if _, stocked := m.stock[sku]; state == "" && version > 0 && !stocked && version > m.metaOf(sku)["cver"] {
			m.metaOf(sku)["cver"] = version // a warm-up reading MySQL now must not load a level before it
		}
		if _, stocked := m.stock[sku]; state == "" && version > 0 && stocked && version > m.metaOf(sku)["wver"] {
			m.stock[sku] -= qty // Redis lost the hold: take the units the commit took
			if m.users[sku] == nil {
				m.users[sku] = map[string]int64{}
			}
			if user != "" {
				m.users[sku][user] += qty
			}
		}
		if state == StatusHeld {
			unhold(old.qty)
			h.state = StatusConfirmed
			if meta := m.metaOf(sku); version > meta["cver"] {
				meta["cver"] = version
			}
		}
		h.paid = h.paid || paid
		return returned, false
	}

	if state != "" && old.hasRel && old.rel == token {
		return returned, false
	}
	switch {
	case state == StatusHeld:
		unhold(old.qty)
		giveBack(old.qty, old.user, old.group, false)
		returned = true
	case row.Cancellation == Refunded && row.Release == ReleaseOwed && (state == StatusConfirmed || state == ""):
		// A warm-up from a level at or past the refund counted its units already.
		counted := row.RefundVersion > 0 && m.meta[sku]["wver"] >= row.RefundVersion
		giveBack(qty, user, gid, counted)
		returned = returned || !counted // a stray returned above still counts
	}
	h.state, h.reason, h.refunded, h.rel, h.hasRel = StatusCancelled, row.Reason, row.Cancellation == Refunded, token, true
	return returned, false
}

// Hold mirrors redisstore's Hold (HGETALL of the hold the id names).
func (m *memHolds) Hold(_ context.Context, id string, bucket int) (Reservation, error) {
	err := m.enter("Hold")
	defer m.mu.Unlock()
	if err != nil {
		return Reservation{}, err
	}
	sku, ok := SKUOf(id)
	if !ok {
		return Reservation{}, ErrNotFound
	}
	h, ok := m.holds[holdKey(BucketName(sku, bucket), id)]
	if !ok || h.credited {
		return Reservation{}, ErrNotFound
	}
	return h.reservation(id), nil
}

// Expired mirrors expired.lua plus redisstore's Expired (HELD only; drops index entries of lost holds).
func (m *memHolds) Expired(_ context.Context, sku string, grace time.Duration, limit int) ([]Reservation, error) {
	err := m.enter("Expired")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cutoff := m.nowMS() - grace.Milliseconds()
	var ids []string
	for id, d := range m.exp[sku] {
		if d <= cutoff {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { // ZRANGEBYSCORE: by score, then member
		a, b := m.exp[sku][ids[i]], m.exp[sku][ids[j]]
		return a < b || (a == b && ids[i] < ids[j])
	})
	if len(ids) > limit {
		ids = ids[:limit]
	}
	var out []Reservation
	for _, id := range ids {
		h, ok := m.holds[holdKey(sku, id)]
		if !ok {
			delete(m.exp[sku], id)
			continue
		}
		if h.state == StatusHeld {
			out = append(out, h.reservation(id))
		}
	}
	return out, nil
}

// Stock mirrors redisstore's Stock (GET stock, HMGET meta held added ver).
func (m *memHolds) Stock(_ context.Context, sku string) (RedisStock, error) {
	err := m.enter("Stock")
	defer m.mu.Unlock()
	if err != nil {
		return RedisStock{}, err
	}
	avail, ok := m.stock[sku]
	if !ok {
		return RedisStock{}, ErrUnknownSKU
	}
	meta := m.meta[sku]
	return RedisStock{SKU: sku, Available: avail, Held: meta["held"], AdminDelta: meta["added"], Version: meta["ver"], Moving: meta["moving"],
		OpensAt: fromMS(meta["opens"]), ClosesAt: fromMS(meta["closes"]), Ahead: meta["ahead"], AdmitPermille: int(meta["room"])}, nil
}

// Sync mirrors stock.lua (admin changes of a SKU Redis knows).
func (m *memHolds) Sync(_ context.Context, level StockLevel) (SyncResult, error) {
	err := m.enter("Sync")
	defer m.mu.Unlock()
	if err != nil {
		return SyncNone, err
	}
	if _, ok := m.stock[level.SKU]; !ok {
		return SyncMissing, nil
	}
	meta := m.metaOf(level.SKU)
	ver, ok := meta["ver"]
	if !ok {
		ver = -1
	}
	if level.Version <= ver {
		return SyncNone, nil
	}
	added := meta["added"] // a SKU written before meta.added existed counts as 0 applied
	meta["ver"], meta["added"], meta["limit"] = level.Version, level.AdminDelta, int64(level.PerUserLimit)
	meta["rate"], meta["burst"], meta["k"] = int64(level.UserRate), int64(level.UserBurst), int64(level.BucketCount())
	meta["opens"], meta["closes"] = windowMS(level.OpensAt), windowMS(level.ClosesAt)
	meta["room"] = int64(level.AdmitPermille)
	d := level.AdminDelta - added
	if d == 0 {
		return SyncNone, nil
	}
	m.stock[level.SKU] += d
	return SyncAdjusted, nil
}

// windowMS and fromMS mirror redisstore's: a window bound in meta is unix ms, 0 for none.
func windowMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// HeldIDs mirrors redisstore's HeldIDs (ZRANGE exp 0 limit-1).
func (m *memHolds) HeldIDs(_ context.Context, sku string, limit int) ([]string, error) {
	err := m.enter("HeldIDs")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var ids []string
	for id := range m.exp[sku] {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := m.exp[sku][ids[i]], m.exp[sku][ids[j]]
		return a < b || (a == b && ids[i] < ids[j])
	})
	if limit > 0 && len(ids) > limit { // ZRANGE 0 limit-1: 0 is every id
		ids = ids[:limit]
	}
	return ids, nil
}

// UnpaidIDs mirrors redisstore's UnpaidIDs (HSCAN of the unpaid hash).
func (m *memHolds) UnpaidIDs(_ context.Context, bucket string, limit int) ([]string, error) {
	err := m.enter("UnpaidIDs")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var ids []string
	for id := range m.unpaid[bucket] {
		if len(ids) < limit {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Warm mirrors warm.lua.
// EndWhole mirrors redisstore's: the fake never says whole (its Warm
// ignores Created), so there is nothing to end.
func (m *memHolds) EndWhole(_ context.Context, _ string) error {
	err := m.enter("EndWhole")
	defer m.mu.Unlock()
	return err
}

func (m *memHolds) Warm(_ context.Context, level StockLevel, ids []string, confirmed []Reservation) (SyncResult, error) {
	err := m.enter("Warm")
	defer m.mu.Unlock()
	if err != nil {
		return SyncNone, err
	}
	if _, ok := m.stock[level.SKU]; ok {
		return SyncNone, nil
	}
	meta := m.metaOf(level.SKU)
	if meta["cver"] > level.Version {
		return SyncStale, nil
	}
	held := meta["held"]
	token := map[string]string{}
	for _, r := range confirmed {
		token[r.ID] = r.Token
	}
	for _, id := range ids {
		var state Status
		var h *memHold
		if h = m.holds[holdKey(level.SKU, id)]; h != nil {
			state = h.state
		}
		t, ok := token[id]
		switch {
		case ok && state == StatusHeld && (t == "" || h.token == t):
			held -= h.qty
		case ok && state == StatusHeld: // a stray: counted as held, like an undecided hold
		case ok && state != StatusConfirmed, !ok && state != StatusHeld:
			return SyncStale, nil // a listed hold moved since MySQL was read
		}
	}
	m.stock[level.SKU] = level.Available - held
	meta["ver"], meta["added"], meta["limit"], meta["wver"] = level.Version, level.AdminDelta, int64(level.PerUserLimit), level.Version
	meta["rate"], meta["burst"], meta["k"] = int64(level.UserRate), int64(level.UserBurst), int64(level.BucketCount())
	meta["ahead"] = 0
	meta["wn"]++
	meta["opens"], meta["closes"] = windowMS(level.OpensAt), windowMS(level.ClosesAt)
	meta["room"] = int64(level.AdmitPermille)
	_, bucket := ParseBucket(level.SKU)
	delete(m.unpaid, level.SKU) // rebuilt from MySQL's unpaid rows, but those settled since the read
	meta["unpaid"] = 0
	for _, r := range confirmed {
		h := m.holds[holdKey(level.SKU, r.ID)]
		if r.Status == StatusConfirmed && r.Bucket == bucket && !r.PayBy.IsZero() && r.PaidAt.IsZero() &&
			(h == nil || (h.state != StatusCancelled && !h.paid)) {
			m.unpaidAdd(level.SKU, r.ID, int64(r.Qty))
		}
	}
	return SyncWarmed, nil
}

// Heal mirrors heal.lua.
func (m *memHolds) Heal(_ context.Context, seen RedisStock, drift int64, after time.Duration) (bool, error) {
	err := m.enter("Heal")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	meta := m.metaOf(seen.SKU)
	now := m.nowMS()
	avail, ok := m.stock[seen.SKU]
	if !ok || avail != seen.Available || meta["held"] != seen.Held || drift == 0 {
		delete(meta, "drift")
		delete(meta, "drift_at")
		return false, nil
	}
	prev, hasPrev := meta["drift"]
	prevAt, hasAt := meta["drift_at"]
	if !hasPrev || prev != drift || !hasAt {
		meta["drift"], meta["drift_at"] = drift, now
		return false, nil
	}
	if now-prevAt < after.Milliseconds() {
		return false, nil
	}
	m.stock[seen.SKU] += drift
	delete(meta, "drift")
	delete(meta, "drift_at")
	return true, nil
}

// Buckets mirrors redisstore's Buckets (EXISTS stock, HMGET meta k groups).
func (m *memHolds) Buckets(_ context.Context, sku string) (int, bool, error) {
	err := m.enter("Buckets")
	defer m.mu.Unlock()
	if err != nil {
		return 0, false, err
	}
	if _, ok := m.stock[sku]; !ok {
		return 0, false, ErrUnknownSKU
	}
	_, groups := m.meta[sku]["groups"]
	return int(max(1, m.meta[sku]["k"])), groups, nil
}

// TakeOut mirrors takeout.lua.
func (m *memHolds) TakeOut(_ context.Context, t Reservation, ttl time.Duration) (Reservation, error) {
	err := m.enter("TakeOut")
	defer m.mu.Unlock()
	if err != nil {
		return Reservation{}, err
	}
	name := BucketName(t.SKU, t.Bucket)
	if h, ok := m.holds[holdKey(name, t.ID)]; ok {
		return h.reservation(t.ID), nil
	}
	avail, ok := m.stock[name]
	if !ok {
		return Reservation{}, ErrUnknownSKU
	}
	if avail < int64(t.Qty) {
		return Reservation{}, ErrSoldOut
	}
	now := m.nowMS()
	deadline := now + ttl.Milliseconds()
	m.stock[name] -= int64(t.Qty)
	m.metaOf(name)["held"] += int64(t.Qty)
	m.metaOf(name)["moving"] += int64(t.Qty)
	m.holds[holdKey(name, t.ID)] = &memHold{sku: t.SKU, qty: int64(t.Qty), token: t.Token, state: StatusHeld,
		deadline: deadline, created: now, bucket: t.Bucket, transfer: true, into: t.Into}
	if m.exp[name] == nil {
		m.exp[name] = map[string]int64{}
	}
	m.exp[name][t.ID] = deadline
	t.ExpiresAt, t.CreatedAt, t.Status = time.UnixMilli(deadline).UTC(), time.UnixMilli(now).UTC(), StatusHeld
	return t, nil
}

// Credit mirrors credit.lua.
func (m *memHolds) Credit(_ context.Context, t Reservation) (bool, error) {
	err := m.enter("Credit")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	name := BucketName(t.SKU, t.Into)
	key := holdKey(name, t.ID)
	mark, marked := m.holds[key]
	if marked && (!mark.ahead || t.TransferVersion == 0) {
		return false, nil // credited by its record, or a repeat of the credit ahead
	}
	if _, ok := m.stock[name]; !ok {
		return false, ErrUnknownSKU
	}
	meta := m.metaOf(name)
	if t.TransferVersion == 0 {
		if m.nowMS() >= t.ExpiresAt.UnixMilli() {
			return false, nil // too late to credit ahead of the record
		}
		m.stock[name] += int64(t.Qty)
		meta["ahead"] += int64(t.Qty)
		m.holds[key] = &memHold{sku: t.SKU, qty: int64(t.Qty), credited: true, ahead: true, wn: meta["wn"],
			bucket: t.Into, into: t.Bucket, token: t.Token, deadline: t.ExpiresAt.UnixMilli()}
		return true, nil
	}
	credited := false
	switch {
	case marked && mark.wn == meta["wn"]:
		meta["ahead"] -= int64(t.Qty) // counted since the credit ahead
	case meta["wver"] < t.TransferVersion:
		m.stock[name] += int64(t.Qty)
		credited = true
	}
	m.holds[key] = &memHold{sku: t.SKU, qty: int64(t.Qty), credited: true, bucket: t.Into}
	return credited, nil
}

// CreditsAhead mirrors redisstore's listing of credit.lua's ahead index
// (a mark's into field holds its giving bucket here).
func (m *memHolds) CreditsAhead(_ context.Context, bucket string, grace time.Duration, limit int) ([]Reservation, error) {
	err := m.enter("CreditsAhead")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	sku, into := ParseBucket(bucket)
	cutoff := m.nowMS() - grace.Milliseconds()
	var out []Reservation
	for key, h := range m.holds {
		if !h.ahead || h.bucket != into || h.sku != sku || h.deadline > cutoff || len(out) == limit {
			continue
		}
		out = append(out, Reservation{ID: strings.TrimPrefix(key, holdKey(bucket, "")), SKU: sku, Qty: int(h.qty), Bucket: h.into,
			Transfer: true, Into: into, Token: h.token, Status: StatusHeld, ExpiresAt: time.UnixMilli(h.deadline).UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAt.Before(out[j].ExpiresAt) })
	return out, nil
}

// Landed mirrors landed.lua.
func (m *memHolds) Landed(_ context.Context, t Reservation) error {
	err := m.enter("Landed")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	name := BucketName(t.SKU, t.Bucket)
	h, ok := m.holds[holdKey(name, t.ID)]
	if !ok || h.state != StatusHeld || h.token != t.Token || !h.transfer || h.landed {
		return nil
	}
	m.metaOf(name)["moving"] -= h.qty
	h.landed = true
	return nil
}

// FollowAll mirrors redisstore's pipeline of follow.lua calls.
func (m *memHolds) FollowAll(ctx context.Context, rows []Reservation, version int64) ([]bool, []error) {
	returned, errs := make([]bool, len(rows)), make([]error, len(rows))
	for i, row := range rows {
		returned[i], errs[i] = m.Follow(ctx, row, version)
	}
	return returned, errs
}

// Touch mirrors touch.lua.
func (m *memHolds) Touch(_ context.Context, sku string, ttl time.Duration) (LiveSKU, error) {
	err := m.enter("Touch")
	defer m.mu.Unlock()
	if err != nil {
		return LiveSKU{}, err
	}
	m.live[sku] = max(m.live[sku], m.nowMS()+ttl.Milliseconds())
	return LiveSKU{SKU: sku, Until: time.UnixMilli(m.live[sku]).UTC()}, nil
}

// Withdraw mirrors unmark.lua with ARGV[4] "1".
func (m *memHolds) Withdraw(_ context.Context, l LiveSKU) (bool, error) {
	err := m.enter("Withdraw")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	if cur, ok := m.live[l.SKU]; !ok || cur != l.Until.UnixMilli() {
		return false, nil
	}
	delete(m.live, l.SKU)
	return true, nil
}

// Live mirrors ZRANGE live 0 limit-1 WITHSCORES (by score, then member).
func (m *memHolds) Live(_ context.Context, limit int) ([]LiveSKU, error) {
	err := m.enter("Live")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]LiveSKU, 0, len(m.live))
	for sku, until := range m.live {
		out = append(out, LiveSKU{SKU: sku, Until: time.UnixMilli(until).UTC()})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Until.Equal(out[j].Until) {
			return out[i].Until.Before(out[j].Until)
		}
		return out[i].SKU < out[j].SKU
	})
	return out[:min(len(out), limit)], nil
}

// Unmark mirrors unmark.lua.
func (m *memHolds) Unmark(_ context.Context, l LiveSKU) (bool, error) {
	err := m.enter("Unmark")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	cur, ok := m.live[l.SKU]
	if !ok || cur != l.Until.UnixMilli() || cur >= m.nowMS() {
		return false, nil
	}
	delete(m.live, l.SKU)
	return true, nil
}

// Cursor mirrors GET of the cursor key.
func (m *memHolds) Cursor(context.Context) (string, error) {
	err := m.enter("Cursor")
	defer m.mu.Unlock()
	return m.cursor, err
}

// SetCursor mirrors SET of the cursor key.
func (m *memHolds) SetCursor(_ context.Context, sku string) error {
	err := m.enter("SetCursor")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	m.cursor = sku
	return nil
}

// Now mirrors redisstore's Now with WithClock.
func (m *memHolds) Now(context.Context) (time.Time, error) {
	err := m.enter("Now")
	defer m.mu.Unlock()
	if err != nil {
		return time.Time{}, err
	}
	return m.clock.Now(), nil
}

// CreateGroup mirrors group_create.lua (a repeat changes nothing).
func (m *memHolds) CreateGroup(_ context.Context, g Group) error {
	err := m.enter("CreateGroup")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	key := groupKey(g.SKU, g.ID)
	if _, ok := m.groups[key]; ok {
		return nil
	}
	m.groups[key] = &memGroup{capacity: g.Capacity, remaining: g.Capacity, status: GroupOpen, deadline: g.Deadline.UnixMilli()}
	m.metaOf(g.SKU)["groups"] = 1
	return nil
}

// Group mirrors redisstore's Group (HGETALL of the group hash).
func (m *memHolds) Group(_ context.Context, sku, id string) (Group, error) {
	err := m.enter("Group")
	defer m.mu.Unlock()
	if err != nil {
		return Group{}, err
	}
	g, ok := m.groups[groupKey(sku, id)]
	if !ok {
		return Group{}, ErrUnknownGroup
	}
	out := Group{
		ID: id, SKU: sku, Capacity: g.capacity, Remaining: g.remaining, Status: g.status,
		Deadline: time.UnixMilli(g.deadline).UTC(),
	}
	if g.formedAt > 0 {
		out.FormedAt = time.UnixMilli(g.formedAt).UTC()
	}
	if g.fullAt > 0 && g.remaining <= 0 {
		out.FullAt = time.UnixMilli(g.fullAt).UTC()
	}
	return out, nil
}

// FormGroup mirrors group_form.lua.
func (m *memHolds) FormGroup(_ context.Context, g Group, formedAt time.Time) (bool, error) {
	err := m.enter("FormGroup")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	mg, ok := m.groups[groupKey(g.SKU, g.ID)]
	if !ok || mg.status == GroupFailed {
		return false, nil
	}
	if mg.status == GroupOpen {
		mg.status, mg.formedAt, mg.remaining = GroupFormed, formedAt.UnixMilli(), 0
	}
	return true, nil
}

// CloseGroup mirrors group_close.lua.
func (m *memHolds) CloseGroup(_ context.Context, g Group) (GroupClosing, error) {
	err := m.enter("CloseGroup")
	defer m.mu.Unlock()
	if err != nil {
		return GroupClosing{}, err
	}
	key := groupKey(g.SKU, g.ID)
	mg, ok := m.groups[key]
	if !ok {
		return GroupClosing{Unknown: true}, nil
	}
	if mg.status == GroupFormed {
		c := GroupClosing{Status: GroupFormed}
		if mg.formedAt > 0 {
			c.FormedAt = time.UnixMilli(mg.formedAt).UTC()
		}
		return c, nil
	}
	if mg.status == GroupOpen {
		if m.nowMS() < mg.deadline {
			return GroupClosing{NotDue: true}, nil
		}
		if mg.remaining <= 0 {
			c := GroupClosing{Full: true}
			if mg.fullAt > 0 {
				c.FullAt = time.UnixMilli(mg.fullAt).UTC()
			}
			return c, nil
		}
		mg.status = GroupFailed
	}
	holders := []string{}
	for _, id := range m.members[key] {
		holders = append(holders, id)
	}
	sort.Strings(holders) // HVALS has no order; sorted for repeatable tests
	return GroupClosing{Status: GroupFailed, Holders: holders}, nil
}

// AcceptJoin mirrors group_accept.lua.
func (m *memHolds) AcceptJoin(_ context.Context, r Reservation) (bool, error) {
	err := m.enter("AcceptJoin")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	h, ok := m.holds[holdKey(BucketName(r.SKU, r.Bucket), r.ID)]
	switch {
	case ok && h.token == r.Token && h.state == StatusHeld:
		h.sent = true
	case ok && h.token == r.Token && h.state == StatusConfirmed:
	default:
		return false, ErrNotFound
	}
	g, ok := m.groups[groupKey(r.SKU, r.GroupID)]
	return ok && g.remaining == 0, nil
}

// GroupHoldersAccepted mirrors redisstore's read of the members and their holds.
func (m *memHolds) GroupHoldersAccepted(_ context.Context, g Group) (bool, error) {
	err := m.enter("GroupHoldersAccepted")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	for _, id := range m.members[groupKey(g.SKU, g.ID)] {
		if h, ok := m.holds[holdKey(g.SKU, id)]; ok && h.state == StatusHeld && !h.sent {
			return false, nil
		}
	}
	return true, nil
}

// CloseGroups mirrors CloseGroup on each group (one pipeline).
func (m *memHolds) CloseGroups(ctx context.Context, gs []Group) ([]GroupClosing, []error) {
	out, errs := make([]GroupClosing, len(gs)), make([]error, len(gs))
	for i, g := range gs {
		out[i], errs[i] = m.CloseGroup(ctx, g)
	}
	return out, errs
}

// ---------------------------------------------------------------- MySQL

// memRow is a reservations row: the reservation and its updated_at.
type memRow struct {
	r       Reservation
	updated time.Time
}

// memGroupRow is a group_buys row (Remaining is not a column).
type memGroupRow struct {
	g       Group
	settled bool
}

// memEvent is a row of events.
type memEvent struct {
	e         Event
	published bool
}

// memLedger models the MySQL schema: product_stock, reservations,
// user_units, stock_change_keys, group_buys, group_members and events.
type memLedger struct {
	mu        sync.Mutex
	stock     map[string]*StockLevel       // product_stock
	rows      map[string]*memRow           // reservations
	units     map[string]map[string]int64  // user_units: sku -> user -> confirmed units
	keys      map[string]string            // stock_change_keys: sku + "\x00" + key -> the change it recorded
	groups    map[string]*memGroupRow      // group_buys
	members   map[string]map[string]string // group_members: group -> user -> reservation id
	events    []*memEvent                  // events, in seq order
	fail      map[string]error             // method -> error returned before anything runs
	conflicts int                          // Apply/ApplyBatch answer ErrVersionConflict this many times first (even when locking: a deadlock)
	locked    []Locking                    // the mode of each Apply that reached the stock row
	calls     map[string]int               // method -> calls
	// beforeFence runs at the start of Fence, outside the lock: a racing
	// writer (a persist) that reaches the row first.
	beforeFence func(Reservation)
	audits      map[string]AuditResult // stock_audits
	warmUps     map[string]int64       // product_stock.warm_ups
}

func newMemLedger() *memLedger {
	return &memLedger{
		stock: map[string]*StockLevel{}, rows: map[string]*memRow{}, units: map[string]map[string]int64{},
		keys: map[string]string{}, groups: map[string]*memGroupRow{}, members: map[string]map[string]string{},
		fail: map[string]error{}, calls: map[string]int{},
	}
}

func (l *memLedger) enter(name string) error {
	l.mu.Lock()
	l.calls[name]++
	return l.fail[name]
}

// msUTC mirrors mysqlstore's utc: DATETIME(3) keeps milliseconds.
func msUTC(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// msNullTime mirrors a NULL-able DATETIME read back (zero stays zero).
func msNullTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return msUTC(t)
}

// row returns the reservations row of id, for assertions.
func (l *memLedger) row(id string) (Reservation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	row, ok := l.rows[id]
	if !ok {
		return Reservation{}, false
	}
	return row.r, true
}

// available returns product_stock.available, for assertions (-1: no row).
func (l *memLedger) available(sku string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.stock[sku]
	if !ok {
		return -1
	}
	return st.Available
}

// insert writes a reservations row as the INSERTs of Apply, ApplyBatch and Fence do.
func (l *memLedger) insert(r Reservation, status Status, reason Reason, now time.Time) Reservation {
	row := Reservation{
		ID: r.ID, SKU: r.SKU, Qty: r.Qty, UserID: r.UserID, GroupID: r.GroupID, Token: r.Token,
		Status: status, Reason: reason,
		ExpiresAt: msNullTime(r.ExpiresAt), CreatedAt: msUTC(r.CreatedAt),
		Bucket: r.Bucket, Transfer: r.Transfer, Into: r.Into, PayBy: msNullTime(r.PayBy),
	}
	if status == StatusCancelled { // a fence: release owed, its event written (none for a transfer)
		if reason == ReasonOrderCancelled {
			row.Note = r.Note
		} else {
			r.Note = ""
		}
		row.PayBy = time.Time{}
		row.Cancellation, row.Release = Fenced, ReleaseOwed
		if !r.Transfer {
			l.write(CancelledEvent(r, reason, false, now))
		}
	} else if !r.Transfer {
		l.write(ConfirmedEvent(r, now))
	}
	l.rows[r.ID] = &memRow{r: row, updated: msUTC(now)}
	return row
}

// write mirrors writeEvents: INSERT INTO events … ON DUPLICATE KEY (event_id) no-op.
func (l *memLedger) write(e Event) {
	for _, have := range l.events {
		if have.e.ID == e.ID {
			return
		}
	}
	l.events = append(l.events, &memEvent{e: e})
}

func (l *memLedger) addUnits(sku, user string, n int64) {
	if l.units[sku] == nil {
		l.units[sku] = map[string]int64{}
	}
	l.units[sku][user] += n
}

// Apply mirrors mysqlstore's Apply (INSERT CONFIRMED, version-checked UPDATE product_stock, user_units, joinGroup).
func (l *memLedger) Apply(_ context.Context, r Reservation, lock Locking, now time.Time) (BatchResult, error) {
	err := l.enter("Apply")
	defer l.mu.Unlock()
	out := BatchResult{Row: r}
	if err != nil {
		return out, err
	}
	if row, ok := l.rows[r.ID]; ok {
		if row.r.Status == StatusConfirmed {
			return BatchResult{Result: AlreadyConfirmed, Row: row.r}, nil
		}
		return BatchResult{Result: AlreadyCancelled, Row: row.r}, nil
	}
	st, ok := l.stock[r.SKU]
	if !ok || r.Bucket < 0 || r.Bucket >= st.BucketCount() {
		out.Result = NoSuchSKU // no such SKU, or no such bucket of it
		return out, nil
	}
	if st.Available < int64(r.Qty) {
		out.Result = Insufficient
		return out, nil
	}
	l.locked = append(l.locked, lock)
	if l.conflicts > 0 {
		l.conflicts--
		return out, fmt.Errorf("apply %s: %w", r.ID, ErrVersionConflict)
	}
	if st.PerUserLimit > 0 && l.units[r.SKU][r.UserID]+int64(r.Qty) > int64(st.PerUserLimit) {
		out.Result = OverLimit // rolled back
		return out, nil
	}
	var g *memGroupRow
	late := false        // the group was FORMED before this join: it opens its own pay window only
	if r.GroupID != "" { // joinGroup
		if _, dup := l.members[r.GroupID][r.UserID]; dup {
			out.Result = GroupDuplicate
			return out, nil
		}
		g = l.groups[r.GroupID]
		if g == nil || g.g.SKU != r.SKU || (g.g.Status != GroupOpen && g.g.Status != GroupFormed) || g.g.Members >= g.g.Capacity {
			if g == nil || g.g.SKU != r.SKU || g.g.Status == GroupFailed {
				out.Result = GroupNotOpen
			} else {
				out.Result = GroupNoSlot
			}
			return out, nil
		}
	}
	// Commit.
	within := st.PayWithin
	if r.GroupID == "" && within > 0 {
		r.PayBy = msUTC(now).Add(within)
	}
	if r.GroupID != "" {
		r.PayBy = time.Time{}
		if within > 0 && (g.g.Status == GroupFormed || g.g.Members+1 >= g.g.Capacity) { // formed with r in it
			r.PayBy = msUTC(now).Add(within)
		}
	}
	l.insert(r, StatusConfirmed, "", now)
	st.Available -= int64(r.Qty)
	moveShare(st, r.Bucket, -int64(r.Qty))
	st.Version++
	if st.PerUserLimit > 0 {
		l.addUnits(r.SKU, r.UserID, int64(r.Qty))
	}
	if g != nil {
		if l.members[r.GroupID] == nil {
			l.members[r.GroupID] = map[string]string{}
		}
		l.members[r.GroupID][r.UserID] = r.ID
		late = g.g.Status == GroupFormed
		if g.g.Members+1 >= g.g.Capacity {
			g.g.Status = GroupFormed
			if g.g.FormedAt.IsZero() {
				g.g.FormedAt = msUTC(now)
			}
		}
		g.g.Members++
		if g.g.Status == GroupFormed && !late { // formedByJoin (a late member's own window was set at its insert)
			opened := l.startPayWindows(r.GroupID, now, within)
			if g.g.Members >= g.g.Capacity {
				e := GroupEvent(g.g, GroupFormed, now)
				if opened {
					e = e.WithPayBy(payDue(now, within))
				}
				l.write(e)
			}
		}
	}
	out.Row = r
	out.Result, out.Version = Applied, st.Version
	return out, nil
}

// payDue is a pay window's deadline from now (zero: no window).
func payDue(now time.Time, within time.Duration) time.Time {
	if within <= 0 {
		return time.Time{}
	}
	return msUTC(now).Add(within)
}

// startPayWindows mirrors mysqlstore's startPayWindows: the FORMED
// group's CONFIRMED members without a pay_by get one; false when the SKU
// has no pay window.
func (l *memLedger) startPayWindows(group string, now time.Time, within time.Duration) bool {
	if within <= 0 {
		return false
	}
	opened := false
	for _, row := range l.rows {
		if row.r.GroupID == group && row.r.Status == StatusConfirmed && row.r.PayBy.IsZero() {
			row.r.PayBy, opened = msUTC(now).Add(within), true
		}
	}
	return opened
}

// ApplyBatch mirrors mysqlstore's ApplyBatch (no group joins: group_id is not written).
func (l *memLedger) ApplyBatch(_ context.Context, sku string, rs []Reservation, now time.Time) ([]BatchResult, error) {
	err := l.enter("ApplyBatch")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]BatchResult, len(rs))
	if len(rs) == 0 {
		return out, nil
	}
	var fresh []int
	seen := map[string]bool{}
	for i, r := range rs {
		switch row, ok := l.rows[r.ID]; {
		case ok && row.r.Status == StatusConfirmed:
			out[i] = BatchResult{Result: AlreadyConfirmed, Row: row.r}
		case ok:
			out[i] = BatchResult{Result: AlreadyCancelled, Row: row.r}
		case seen[r.ID]: // a twin: decided with its first copy below
			out[i] = BatchResult{Result: AlreadyConfirmed, Row: r}
		default:
			seen[r.ID] = true
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return out, nil
	}
	if l.conflicts > 0 { // a fence raced the insert, or a deadlock
		l.conflicts--
		return nil, fmt.Errorf("batch %s: %w", sku, ErrVersionConflict)
	}
	st, ok := l.stock[sku]
	if !ok {
		for i := range out {
			out[i].Result = NoSuchSKU
		}
		return out, nil // rolled back
	}
	limit := int64(st.PerUserLimit)
	var sum int64
	added := map[string]int64{}
	for _, i := range fresh {
		r := rs[i]
		switch {
		case r.Bucket < 0 || r.Bucket >= st.BucketCount():
			out[i] = BatchResult{Result: NoSuchSKU, Row: r}
		case sum+int64(r.Qty) > st.Available:
			out[i] = BatchResult{Result: Insufficient, Row: r}
		case limit > 0 && l.units[sku][r.UserID]+added[r.UserID]+int64(r.Qty) > limit:
			out[i] = BatchResult{Result: OverLimit, Row: r}
		default:
			sum += int64(r.Qty)
			if limit > 0 {
				added[r.UserID] += int64(r.Qty)
			}
			r.PayBy = payDue(now, st.PayWithin)
			out[i] = BatchResult{Result: Applied, Row: r, Version: st.Version + 1}
		}
	}
	for i, r := range rs { // a twin follows its first copy
		if _, have := l.rows[r.ID]; out[i].Result == AlreadyConfirmed && !have {
			for _, j := range fresh {
				if rs[j].ID == r.ID {
					out[i] = out[j]
				}
			}
		}
	}
	// Commit: the refused rows were deleted again; the rest stay CONFIRMED.
	for _, i := range fresh {
		if out[i].Result == Applied {
			r := out[i].Row
			r.GroupID = ""
			l.insert(r, StatusConfirmed, "", now)
			moveShare(st, r.Bucket, -int64(r.Qty))
		}
	}
	if sum > 0 {
		st.Available -= sum
		st.Version++
	}
	for user, n := range added {
		l.addUnits(sku, user, n)
	}
	return out, nil
}

// Fence mirrors mysqlstore's fence (INSERT … 'CANCELLED', released 0 … ON DUPLICATE KEY no-op, its event).
func (l *memLedger) Fence(_ context.Context, r Reservation, reason Reason, now time.Time) (Reservation, bool, error) {
	if hook := l.beforeFence; hook != nil {
		l.beforeFence = nil
		hook(r)
	}
	err := l.enter("Fence")
	defer l.mu.Unlock()
	if err != nil {
		return r, false, err
	}
	if row, ok := l.rows[r.ID]; ok {
		return row.r, false, nil
	}
	return l.insert(r, StatusCancelled, reason, now), true, nil
}

// Refund mirrors mysqlstore's refund transaction.
func (l *memLedger) Refund(_ context.Context, id string, reason Reason, note string, now time.Time) (Reservation, bool, error) {
	err := l.enter("Refund")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, false, err
	}
	row, ok := l.rows[id]
	if !ok || row.r.Transfer {
		return Reservation{}, false, ErrNotFound
	}
	if row.r.Status != StatusConfirmed || !row.r.PaidAt.IsZero() { // decided, or PAID: final
		return row.r, false, nil
	}
	r := &row.r
	if reason == ReasonOrderCancelled {
		r.Note = note
	}
	l.write(CancelledEvent(*r, reason, true, now))
	r.Status, r.Reason, r.Cancellation, r.Release = StatusCancelled, reason, Refunded, ReleaseOwed
	row.updated = msUTC(now)
	r.RefundVersion = 0 // SELECT version after the UPDATE: NULL (0) if the stock row is gone
	if st, ok := l.stock[r.SKU]; ok {
		st.Available += int64(r.Qty)
		moveShare(st, r.Bucket, int64(r.Qty))
		st.Version++
		r.RefundVersion = st.Version
	}
	if u, ok := l.units[r.SKU][r.UserID]; ok {
		l.units[r.SKU][r.UserID] = max(u-int64(r.Qty), 0)
	}
	if r.GroupID != "" {
		// A FORMED group stays FORMED: the member leaves, the group does not reopen.
		for user, rid := range l.members[r.GroupID] {
			if rid == id {
				delete(l.members[r.GroupID], user)
			}
		}
		if g := l.groups[r.GroupID]; g != nil && g.g.Members > 0 {
			g.g.Members--
		}
	}
	return *r, true, nil
}

// Pay mirrors mysqlstore's pay transaction (the row FOR UPDATE, a join's
// group FORMED, paid_at set, its ReservationPaid).
func (l *memLedger) Pay(_ context.Context, id string, now time.Time) (Reservation, bool, error) {
	err := l.enter("Pay")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, false, err
	}
	row, ok := l.rows[id]
	if !ok || row.r.Transfer {
		return Reservation{}, false, ErrNotFound
	}
	if row.r.Status != StatusConfirmed || !row.r.PaidAt.IsZero() {
		return row.r, false, nil
	}
	if gid := row.r.GroupID; gid != "" {
		if g := l.groups[gid]; g == nil || g.g.Status != GroupFormed {
			return row.r, false, fmt.Errorf("pay %s: %w", id, ErrGroupNotFormed)
		}
	}
	l.write(PaidEvent(row.r, now))
	row.r.PaidAt, row.updated = msUTC(now), msUTC(now)
	return row.r, true, nil
}

// PaymentsDue mirrors `SELECT … WHERE status = 'CONFIRMED' AND paid_at IS NULL AND pay_by <= ? ORDER BY pay_by LIMIT ?`.
func (l *memLedger) PaymentsDue(_ context.Context, t time.Time, limit int) ([]Reservation, error) {
	err := l.enter("PaymentsDue")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, row := range l.rows {
		r := row.r
		if r.Status == StatusConfirmed && r.PaidAt.IsZero() && !r.PayBy.IsZero() && !r.PayBy.After(msUTC(t)) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PayBy.Before(out[j].PayBy) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Reservation mirrors mysqlstore's Reservation (SELECT by id).
func (l *memLedger) Reservation(_ context.Context, id string) (Reservation, error) {
	err := l.enter("Reservation")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, err
	}
	row, ok := l.rows[id]
	if !ok {
		return Reservation{}, ErrNotFound
	}
	return row.r, nil
}

// MarkReleased mirrors `UPDATE reservations SET released = 1 WHERE reservation_id = ? AND released = 0`.
func (l *memLedger) MarkReleased(_ context.Context, id string) error {
	err := l.enter("MarkReleased")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	if row, ok := l.rows[id]; ok && row.r.Release == ReleaseOwed {
		row.r.Release = ReleaseDone
	}
	return nil
}

// EventsOf mirrors mysqlstore's EventsOf (unpublished, aggregate_id IN …, by seq).
func (l *memLedger) EventsOf(_ context.Context, aggregates []string) ([]Event, error) {
	err := l.enter("EventsOf")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range aggregates {
		want[id] = id != ""
	}
	var out []Event
	for _, e := range l.events {
		if !e.published && want[e.e.AggregateID] {
			out = append(out, e.e)
		}
	}
	return out, nil
}

// Unpublished mirrors mysqlstore's Unpublished (published_at IS NULL AND occurred_at < t, by seq).
func (l *memLedger) Unpublished(_ context.Context, t time.Time, limit int) ([]Event, error) {
	err := l.enter("Unpublished")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Event
	for _, e := range l.events {
		if !e.published && e.e.OccurredAt.Before(msUTC(t)) && len(out) < limit {
			out = append(out, e.e)
		}
	}
	return out, nil
}

// MarkPublished mirrors `UPDATE events SET published_at = ? WHERE event_id IN (…)`
// (the fake keeps a batch's confirmations one by one: published each as it goes).
func (l *memLedger) MarkPublished(_ context.Context, evs []Event, _ time.Time) error {
	err := l.enter("MarkPublished")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	for _, ev := range evs {
		for _, e := range l.events {
			if e.e.ID == ev.ID {
				e.published = true
			}
		}
	}
	return nil
}

// OldestUnpublished mirrors mysqlstore's OldestUnpublished (the first unpublished by seq).
func (l *memLedger) OldestUnpublished(_ context.Context) (time.Time, bool, error) {
	err := l.enter("OldestUnpublished")
	defer l.mu.Unlock()
	if err != nil {
		return time.Time{}, false, err
	}
	for _, e := range l.events {
		if !e.published {
			return e.e.OccurredAt, true, nil
		}
	}
	return time.Time{}, false, nil
}

// unpublished returns the events not published yet, for assertions.
func (l *memLedger) unpublished() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.events {
		if !e.published {
			out = append(out, e.e)
		}
	}
	return out
}

// Outbox mirrors mysqlstore's Outbox (released = 0, updated_at < t).
func (l *memLedger) Outbox(_ context.Context, t time.Time, limit int) ([]Reservation, error) {
	err := l.enter("Outbox")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, row := range l.rows {
		if (row.r.Status == StatusCancelled || row.r.Transfer) && row.updated.Before(msUTC(t)) && row.r.Release == ReleaseOwed {
			out = append(out, row.r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Unreleased mirrors `SELECT COUNT(*) FROM reservations WHERE released = 0 AND sku = ?`.
func (l *memLedger) Unreleased(_ context.Context, sku string) (int, error) {
	err := l.enter("Unreleased")
	defer l.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, row := range l.rows {
		if row.r.Release == ReleaseOwed && row.r.SKU == sku {
			n++
		}
	}
	return n, nil
}

// ChangeStock mirrors mysqlstore's ChangeStock (FOR UPDATE, preconditions, stock_change_keys, admin_delta).
func (l *memLedger) ChangeStock(_ context.Context, c StockChange) (StockLevel, error) {
	err := l.enter("ChangeStock")
	defer l.mu.Unlock()
	if err != nil {
		return StockLevel{}, err
	}
	level := StockLevel{SKU: c.SKU}
	st, exists := l.stock[c.SKU]
	if exists {
		level = levelCopy(st)
	}
	// A retried change (the same key) is answered before its precondition:
	// the first one moved the version it was based on. The key records every
	// field of the change (stock_change_keys).
	key := c.SKU + "\x00" + c.Key
	if c.Key != "" {
		if prev, ok := l.keys[key]; ok {
			if prev != changeFingerprint(c) {
				return StockLevel{}, fmt.Errorf("change stock %s: key %q: %w", c.SKU, c.Key, ErrIdempotencyMismatch)
			}
			return level, nil
		}
	}
	switch {
	case !exists:
		if c.Set == nil {
			return StockLevel{}, ErrUnknownSKU
		}
		if c.IfVersion != nil && *c.IfVersion != 0 || c.IfExists {
			return StockLevel{}, fmt.Errorf("change stock %s: no such sku: %w", c.SKU, ErrPreconditionFailed)
		}
	case c.Set != nil && c.IfVersion == nil && !c.IfExists:
		return StockLevel{}, ErrPreconditionRequired
	case c.IfVersion != nil && *c.IfVersion != level.Version:
		return StockLevel{}, fmt.Errorf("change stock %s: version is %d, not %d: %w", c.SKU, level.Version, *c.IfVersion, ErrPreconditionFailed)
	}
	var delta int64
	switch {
	case c.Set != nil:
		delta = *c.Set - level.Available
	case c.Add != nil:
		delta = *c.Add
	}
	if level.Available+delta < 0 {
		return StockLevel{}, fmt.Errorf("change stock %s: %d available, cannot remove %d: %w", c.SKU, level.Available, -delta, ErrInsufficient)
	}
	if level.Available+delta > 1_000_000_000 {
		return StockLevel{}, &InvalidError{Field: "add", Msg: "passes the most a sku can hold"}
	}
	if level, err = c.ApplyWindow(level); err != nil {
		return StockLevel{}, err
	}
	oldLimit := level.PerUserLimit
	level.Buckets = level.BucketCount()
	if c.Buckets != nil {
		if *c.Buckets < level.Buckets {
			return StockLevel{}, &InvalidError{Field: "buckets", Msg: "buckets can be raised, not lowered"}
		}
		level.Buckets = *c.Buckets
	}
	for len(level.BucketAvailable) < level.Buckets-1 {
		level.BucketAvailable = append(level.BucketAvailable, 0)
	}
	if c.Limit != nil {
		level.PerUserLimit = *c.Limit
	}
	if c.Rate != nil {
		level.UserRate = *c.Rate
	}
	if c.Burst != nil {
		level.UserBurst = *c.Burst
	}
	if c.PayWithin != nil {
		level.PayWithin = *c.PayWithin
	}
	if level, err = c.ApplyRoom(level); err != nil {
		return StockLevel{}, err
	}
	if c.Key != "" { // in the change's transaction: a refused change records no key
		l.keys[key] = changeFingerprint(c)
	}
	level.Available += delta
	level.AdminDelta += delta
	level.Version++
	stored := levelCopy(&level)
	l.stock[c.SKU] = &stored
	if exists && oldLimit == 0 && level.PerUserLimit > 0 { // rebuild user_units
		l.units[c.SKU] = map[string]int64{}
		for _, row := range l.rows {
			if row.r.SKU == c.SKU && row.r.Status == StatusConfirmed {
				l.addUnits(c.SKU, row.r.UserID, int64(row.r.Qty))
			}
		}
	}
	level.Created = !exists
	return level, nil
}

// changeFingerprint is what stock_change_keys records of a change.
func changeFingerprint(c StockChange) string {
	v := func(p any) string {
		switch x := p.(type) {
		case *int64:
			if x != nil {
				return fmt.Sprint(*x)
			}
		case *int:
			if x != nil {
				return fmt.Sprint(*x)
			}
		}
		return "-"
	}
	ms := func(p *time.Time) string {
		switch {
		case p == nil:
			return "-"
		case p.IsZero():
			return "0"
		}
		return fmt.Sprint(p.UnixMilli())
	}
	pay := "-"
	if c.PayWithin != nil {
		pay = fmt.Sprint(int64(*c.PayWithin / time.Second))
	}
	room := "-"
	switch {
	case c.WaitingRoom != nil && !*c.WaitingRoom:
		room = "off"
	case c.AdmitFactor != nil:
		room = fmt.Sprint(int(*c.AdmitFactor*1000 + 0.5))
	case c.WaitingRoom != nil:
		room = "on"
	}
	return fmt.Sprintf("%s|%s|%s|%s|%s|%s|%t|%s|%s|%s|%s|%s", v(c.Set), v(c.Add), v(c.Limit), v(c.Rate), v(c.Burst), v(c.IfVersion), c.IfExists, v(c.Buckets),
		ms(c.OpensAt), ms(c.ClosesAt), pay, room)
}

// levelCopy is a level read from product_stock and stock_buckets: its own
// copy of the shares.
func levelCopy(st *StockLevel) StockLevel {
	out := *st
	out.BucketAvailable = append([]int64(nil), st.BucketAvailable...)
	return out
}

// moveShare mirrors mysqlstore's moveShares for one bucket (bucket 0's share is the rest).
func moveShare(st *StockLevel, b int, n int64) {
	if b == 0 || n == 0 {
		return
	}
	for len(st.BucketAvailable) < b {
		st.BucketAvailable = append(st.BucketAvailable, 0)
	}
	st.BucketAvailable[b-1] += n
}

// Transfer mirrors mysqlstore's transfer transaction.
func (l *memLedger) Transfer(_ context.Context, t Reservation, now time.Time) (Reservation, bool, error) {
	err := l.enter("Transfer")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, false, err
	}
	if !t.Transfer || t.Bucket == t.Into || t.Qty < 1 || t.Bucket < 0 || t.Into < 0 {
		return Reservation{}, false, ErrNotATransfer
	}
	if row, ok := l.rows[t.ID]; ok {
		return row.r, false, nil
	}
	st, ok := l.stock[t.SKU]
	if !ok {
		return Reservation{}, false, ErrUnknownSKU
	}
	if k := max(st.Buckets, 1); t.Bucket >= k || t.Into >= k {
		return Reservation{}, false, ErrNotATransfer
	}
	row := l.insert(t, StatusConfirmed, "", now)
	st.Version++
	moveShare(st, t.Bucket, -int64(t.Qty))
	moveShare(st, t.Into, int64(t.Qty))
	r := &l.rows[t.ID].r
	r.Release, r.TransferVersion = ReleaseOwed, st.Version
	row.Release, row.TransferVersion = ReleaseOwed, st.Version
	return row, true, nil
}

// Stock mirrors `SELECT … FROM product_stock WHERE sku = ?`.
func (l *memLedger) Stock(_ context.Context, sku string) (StockLevel, error) {
	err := l.enter("Stock")
	defer l.mu.Unlock()
	if err != nil {
		return StockLevel{}, err
	}
	st, ok := l.stock[sku]
	if !ok {
		return StockLevel{SKU: sku}, ErrUnknownSKU
	}
	return levelCopy(st), nil
}

// Snapshot mirrors mysqlstore's Snapshot (product_stock and CONFIRMED rows among ids, one read-only tx).
func (l *memLedger) CountWarmUp(_ context.Context, sku string) (int64, bool, error) {
	err := l.enter("CountWarmUp")
	defer l.mu.Unlock()
	if err != nil {
		return 0, false, err
	}
	if _, ok := l.stock[sku]; !ok {
		return 0, false, ErrUnknownSKU
	}
	if l.warmUps == nil {
		l.warmUps = map[string]int64{}
	}
	l.warmUps[sku]++
	reserved := false
	for _, row := range l.rows {
		reserved = reserved || row.r.SKU == sku
	}
	return l.warmUps[sku], reserved, nil
}

func (l *memLedger) Snapshot(_ context.Context, sku string, ids []string) (StockLevel, []Reservation, error) {
	err := l.enter("Snapshot")
	defer l.mu.Unlock()
	if err != nil {
		return StockLevel{}, nil, err
	}
	st, ok := l.stock[sku]
	if !ok {
		return StockLevel{SKU: sku}, nil, ErrUnknownSKU
	}
	var confirmed []Reservation
	seen := map[string]bool{}
	for _, id := range ids {
		if row, ok := l.rows[id]; ok && row.r.Status == StatusConfirmed {
			confirmed = append(confirmed, row.r)
			seen[id] = true
		}
	}
	for id, row := range l.rows { // the unpaid ones within a pay window
		if r := row.r; r.SKU == sku && r.Status == StatusConfirmed && !r.PayBy.IsZero() && r.PaidAt.IsZero() && !seen[id] {
			confirmed = append(confirmed, r)
		}
	}
	return levelCopy(st), confirmed, nil
}

// StocksAfter mirrors `SELECT … FROM product_stock WHERE sku > ? ORDER BY sku LIMIT ?`.
func (l *memLedger) StocksAfter(_ context.Context, after string, limit int) ([]StockLevel, error) {
	err := l.enter("StocksAfter")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []StockLevel
	for _, st := range l.stock {
		if st.SKU > after {
			out = append(out, levelCopy(st))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out[:min(len(out), limit)], nil
}

// Levels mirrors `SELECT … FROM product_stock WHERE sku IN (…)`.
func (l *memLedger) Levels(_ context.Context, skus []string) ([]StockLevel, error) {
	err := l.enter("Levels")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []StockLevel
	seen := map[string]bool{}
	for _, sku := range skus {
		if st, ok := l.stock[sku]; ok && !seen[sku] {
			seen[sku] = true
			out = append(out, levelCopy(st))
		}
	}
	return out, nil
}

// Opening mirrors `SELECT … FROM product_stock WHERE opens_at > ? AND opens_at <= ? ORDER BY opens_at, sku LIMIT ?`.
func (l *memLedger) Opening(_ context.Context, after, until time.Time, limit int) ([]StockLevel, error) {
	err := l.enter("Opening")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []StockLevel
	for _, st := range l.stock {
		if !st.OpensAt.IsZero() && st.OpensAt.After(msUTC(after)) && !st.OpensAt.After(msUTC(until)) {
			out = append(out, levelCopy(st))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.OpensAt.Before(b.OpensAt) || a.OpensAt.Equal(b.OpensAt) && a.SKU < b.SKU
	})
	return out[:min(len(out), limit)], nil
}

// CreateGroup mirrors `INSERT INTO group_buys … SELECT … FROM product_stock WHERE sku = ?`.
func (l *memLedger) CreateGroup(_ context.Context, g Group) error {
	err := l.enter("CreateGroup")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := l.stock[g.SKU]; !ok {
		return ErrUnknownSKU
	}
	if _, dup := l.groups[g.ID]; dup {
		return Unavailable("create group", errors.New("duplicate group id"))
	}
	l.groups[g.ID] = &memGroupRow{g: Group{
		ID: g.ID, SKU: g.SKU, Capacity: g.Capacity, Status: GroupOpen,
		Deadline: msUTC(g.Deadline), CreatedAt: msUTC(g.CreatedAt),
	}}
	return nil
}

// Group mirrors `SELECT … FROM group_buys WHERE group_id = ?` (Remaining is not a column).
func (l *memLedger) Group(_ context.Context, id string) (Group, error) {
	err := l.enter("Group")
	defer l.mu.Unlock()
	if err != nil {
		return Group{}, err
	}
	g, ok := l.groups[id]
	if !ok {
		return Group{}, ErrUnknownGroup
	}
	return g.g, nil
}

// DueGroups mirrors `… WHERE status = 'OPEN' AND deadline <= ? AND (deadline, group_id) > (after) ORDER BY deadline, group_id LIMIT ?`.
func (l *memLedger) DueGroups(_ context.Context, t time.Time, after Group, limit int) ([]Group, error) {
	err := l.enter("DueGroups")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Group
	for _, g := range l.groups {
		if g.g.Status != GroupOpen || g.g.Deadline.After(msUTC(t)) {
			continue
		}
		if after.ID != "" && (g.g.Deadline.Before(after.Deadline) || (g.g.Deadline.Equal(after.Deadline) && g.g.ID <= after.ID)) {
			continue
		}
		out = append(out, g.g)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Deadline.Equal(out[j].Deadline) {
			return out[i].Deadline.Before(out[j].Deadline)
		}
		return out[i].ID < out[j].ID
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// UnsettledGroups mirrors `… WHERE status IN ('FORMED', 'FAILED') AND settled_at IS NULL LIMIT ?`.
func (l *memLedger) UnsettledGroups(_ context.Context, limit int) ([]Group, error) {
	err := l.enter("UnsettledGroups")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Group
	for _, g := range l.groups {
		if (g.g.Status == GroupFailed || g.g.Status == GroupFormed) && !g.settled {
			out = append(out, g.g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// FormGroup mirrors `UPDATE group_buys SET status = 'FORMED', formed_at = ? WHERE group_id = ?
// AND status = 'OPEN' AND NOT EXISTS (an unreleased CANCELLED member row)`, then reads the status.
func (l *memLedger) FormGroup(_ context.Context, id string, formedAt, now time.Time) (bool, error) {
	err := l.enter("FormGroup")
	defer l.mu.Unlock()
	if err != nil {
		return false, err
	}
	g, ok := l.groups[id]
	if !ok {
		return false, ErrUnknownGroup
	}
	pending := false
	for _, row := range l.rows {
		if row.r.GroupID == id && row.r.Status == StatusCancelled && row.r.Release == ReleaseOwed {
			pending = true
		}
	}
	if g.g.Status == GroupOpen && !pending {
		g.g.Status, g.g.FormedAt = GroupFormed, msUTC(formedAt)
		within := time.Duration(0)
		if st, ok := l.stock[g.g.SKU]; ok {
			within = st.PayWithin
		}
		e := GroupEvent(g.g, GroupFormed, formedAt)
		if l.startPayWindows(id, now, within) {
			e = e.WithPayBy(payDue(now, within))
		}
		l.write(e)
	}
	return g.g.Status == GroupFormed, nil
}

// FailGroup mirrors `UPDATE group_buys SET status = 'FAILED' WHERE group_id = ? AND status = 'OPEN' AND deadline <= ?`, then Group.
func (l *memLedger) FailGroup(_ context.Context, id string, now time.Time) (Group, error) {
	err := l.enter("FailGroup")
	defer l.mu.Unlock()
	if err != nil {
		return Group{}, err
	}
	g, ok := l.groups[id]
	if !ok {
		return Group{}, ErrUnknownGroup
	}
	if g.g.Status == GroupOpen && !g.g.Deadline.After(msUTC(now)) {
		g.g.Status = GroupFailed
		l.write(GroupEvent(g.g, GroupFailed, now))
	}
	return g.g, nil
}

// GroupMembers mirrors `SELECT … FROM reservations WHERE group_id = ? AND status = 'CONFIRMED'`.
func (l *memLedger) GroupMembers(_ context.Context, id string) ([]Reservation, error) {
	err := l.enter("GroupMembers")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, row := range l.rows {
		if row.r.GroupID == id && row.r.Status == StatusConfirmed {
			out = append(out, row.r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// FailEmptyGroups mirrors `UPDATE group_buys SET status = 'FAILED', settled_at = ? WHERE group_id IN (…)
// AND status = 'OPEN' AND members = 0 AND deadline <= ?`.
func (l *memLedger) FailEmptyGroups(_ context.Context, ids []string, now time.Time) (int, error) {
	err := l.enter("FailEmptyGroups")
	defer l.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		if g, ok := l.groups[id]; ok && g.g.Status == GroupOpen && g.g.Members == 0 && !g.g.Deadline.After(msUTC(now)) {
			g.g.Status, g.settled = GroupFailed, true
			l.write(GroupEvent(g.g, GroupFailed, now))
			n++
		}
	}
	return n, nil
}

// GroupLeaving mirrors `SELECT … FROM reservations WHERE group_id = ? AND status = 'CANCELLED' AND released = 0`.
func (l *memLedger) GroupLeaving(_ context.Context, id string) ([]Reservation, error) {
	err := l.enter("GroupLeaving")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, row := range l.rows {
		if row.r.GroupID == id && row.r.Status == StatusCancelled && row.r.Release == ReleaseOwed {
			out = append(out, row.r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// GroupSettled mirrors `UPDATE group_buys SET settled_at = … WHERE group_id = ? AND status IN ('FORMED', 'FAILED') AND settled_at IS NULL`.
func (l *memLedger) GroupSettled(_ context.Context, id string) error {
	err := l.enter("GroupSettled")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	if g, ok := l.groups[id]; ok && (g.g.Status == GroupFailed || g.g.Status == GroupFormed) {
		g.settled = true
	}
	return nil
}

// ---------------------------------------------------------------- others

// memQueue stands in for SQS.
type memQueue struct {
	mu   sync.Mutex
	sent []Reservation
	err  error
}

// Enqueue mirrors an SQS SendMessage.
func (q *memQueue) Enqueue(_ context.Context, r Reservation) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	q.sent = append(q.sent, r)
	return nil
}

// memNotifier stands in for EventBridge.
type memNotifier struct {
	mu     sync.Mutex
	events []Event
	err    error
}

func (n *memNotifier) Publish(_ context.Context, evs []Event) []error {
	n.mu.Lock()
	defer n.mu.Unlock()
	errs := make([]error, len(evs))
	for i, e := range evs {
		if n.err != nil {
			errs[i] = n.err
			continue
		}
		n.events = append(n.events, e)
	}
	return errs
}

// cancellations returns the ReservationCancelled events published.
func (n *memNotifier) cancellations() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []Event
	for _, e := range n.events {
		if e.Type == EventCancelled {
			out = append(out, e)
		}
	}
	return out
}

// memMetrics counts what the service counts.
type memMetrics struct {
	mu sync.Mutex
	n  map[string]int
}

func (m *memMetrics) Count(name string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[string]int{}
	}
	m.n[name] += n
}

func (m *memMetrics) get(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[name]
}

// fixedClock is a clock the test moves; the fake Redis reads it too.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// all returns every reservation row (tests inspect what was written).
func (l *memLedger) all() []Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Reservation, 0, len(l.rows))
	for _, r := range l.rows {
		out = append(out, r.r)
	}
	return out
}
