package reservation

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"
)

// The fakes below are in-memory models of the ports with the same
// contracts as the Redis and MySQL adapters, plus switches that inject
// failures. They make the protocol's decisions testable in microseconds;
// the adapters' own tests and the integration tests check the real stores.

var errInjected = Unavailable("fake", errors.New("injected failure"))

type sighting struct {
	drift int64
	at    time.Time
}

type memHolds struct {
	seen   map[string]sighting // heal's memory, per SKU
	mu     sync.Mutex
	stock  map[string]int64
	held   map[string]int64
	holds  map[string]Reservation // by id
	groups map[string]*Group
	member map[string]map[string]string // group -> user -> reservation id
	fail   map[string]error             // method name -> error to return
	calls  map[string]int
}

func newMemHolds() *memHolds {
	return &memHolds{
		stock: map[string]int64{}, held: map[string]int64{}, holds: map[string]Reservation{},
		groups: map[string]*Group{}, member: map[string]map[string]string{}, fail: map[string]error{}, calls: map[string]int{},
		seen: map[string]sighting{},
	}
}

func (m *memHolds) Heal(_ context.Context, sku string, seenAvailable, seenHeld, drift int64, now time.Time, after time.Duration) (bool, error) {
	err := m.enter("Heal")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	if m.stock[sku] != seenAvailable || m.held[sku] != seenHeld || drift == 0 {
		delete(m.seen, sku)
		return false, nil
	}
	prev, ok := m.seen[sku]
	if !ok || prev.drift != drift {
		m.seen[sku] = sighting{drift, now}
		return false, nil
	}
	if now.Sub(prev.at) < after {
		return false, nil
	}
	m.stock[sku] += drift
	delete(m.seen, sku)
	return true, nil
}

func (m *memHolds) enter(name string) error {
	m.mu.Lock()
	m.calls[name]++
	return m.fail[name]
}

func (m *memHolds) Reserve(_ context.Context, r Reservation, now time.Time) (Reservation, bool, error) {
	err := m.enter("Reserve")
	defer m.mu.Unlock()
	if err != nil {
		return Reservation{}, false, err
	}
	if h, ok := m.holds[r.ID]; ok {
		if h.Qty != r.Qty || h.UserID != r.UserID || h.GroupID != r.GroupID {
			return Reservation{}, false, ErrIdempotencyMismatch
		}
		return h, true, nil
	}
	avail, ok := m.stock[r.SKU]
	if !ok {
		return Reservation{}, false, ErrUnknownSKU
	}
	if avail < int64(r.Qty) {
		return Reservation{}, false, ErrSoldOut
	}
	if r.GroupID != "" {
		g, ok := m.groups[r.GroupID]
		switch {
		case !ok || g.SKU != r.SKU:
			return Reservation{}, false, ErrUnknownGroup
		case g.Status == GroupFailed || !now.Before(g.Deadline):
			return Reservation{}, false, ErrGroupClosed
		case m.member[r.GroupID][r.UserID] != "":
			return Reservation{}, false, ErrAlreadyJoined
		case g.Remaining <= 0:
			return Reservation{}, false, ErrGroupFull
		}
		g.Remaining--
		if g.Remaining == 0 {
			g.Status = GroupFormed
		}
		m.member[r.GroupID][r.UserID] = r.ID
	}
	m.stock[r.SKU] -= int64(r.Qty)
	m.held[r.SKU] += int64(r.Qty)
	r.Status = StatusHeld
	m.holds[r.ID] = r
	return r, false, nil
}

func (m *memHolds) Release(_ context.Context, r Reservation, refund bool) (bool, error) {
	err := m.enter("Release")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	h, ok := m.holds[r.ID]
	if !ok {
		r.Status = StatusCancelled
		m.holds[r.ID] = r
		if refund {
			if _, known := m.stock[r.SKU]; known {
				m.giveBack(r)
				return true, nil
			}
		}
		return false, nil
	}
	if h.Status == StatusCancelled || (h.Status == StatusConfirmed && !refund) {
		return false, nil
	}
	if h.Status == StatusHeld {
		m.held[h.SKU] -= int64(h.Qty)
	}
	m.giveBack(h)
	h.Status, h.Reason, h.Refunded = StatusCancelled, r.Reason, refund
	m.holds[r.ID] = h
	return true, nil
}

func (m *memHolds) giveBack(h Reservation) {
	m.stock[h.SKU] += int64(h.Qty)
	if h.GroupID != "" && m.member[h.GroupID][h.UserID] == h.ID {
		delete(m.member[h.GroupID], h.UserID)
		if g := m.groups[h.GroupID]; g != nil {
			g.Remaining++
			if g.Status == GroupFormed {
				g.Status = GroupOpen
			}
		}
	}
}

func (m *memHolds) Confirm(_ context.Context, r Reservation) error {
	err := m.enter("Confirm")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	h, ok := m.holds[r.ID]
	if !ok {
		r.Status = StatusConfirmed
		m.holds[r.ID] = r
		return nil
	}
	if h.Status == StatusHeld {
		m.held[h.SKU] -= int64(h.Qty)
		h.Status = StatusConfirmed
		m.holds[r.ID] = h
	}
	return nil
}

func (m *memHolds) Hold(_ context.Context, id string) (Reservation, error) {
	err := m.enter("Hold")
	defer m.mu.Unlock()
	if err != nil {
		return Reservation{}, err
	}
	h, ok := m.holds[id]
	if !ok {
		return Reservation{}, ErrNotFound
	}
	return h, nil
}

func (m *memHolds) Expired(_ context.Context, sku string, t time.Time, limit int) ([]Reservation, error) {
	err := m.enter("Expired")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, h := range m.holds {
		if h.SKU == sku && h.Status == StatusHeld && !h.ExpiresAt.After(t) {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAt.Before(out[j].ExpiresAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (m *memHolds) Stock(_ context.Context, sku string) (int64, int64, error) {
	err := m.enter("Stock")
	defer m.mu.Unlock()
	if err != nil {
		return 0, 0, err
	}
	avail, ok := m.stock[sku]
	if !ok {
		return 0, 0, ErrUnknownSKU
	}
	return avail, m.held[sku], nil
}

func (m *memHolds) Warm(_ context.Context, level StockLevel) (bool, error) {
	err := m.enter("Warm")
	defer m.mu.Unlock()
	if err != nil {
		return false, err
	}
	if _, ok := m.stock[level.SKU]; ok {
		return false, nil
	}
	m.stock[level.SKU] = level.Available - m.held[level.SKU]
	return true, nil
}

func (m *memHolds) AdjustStock(_ context.Context, level StockLevel, delta int64) error {
	err := m.enter("AdjustStock")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := m.stock[level.SKU]; !ok {
		m.stock[level.SKU] = level.Available - m.held[level.SKU]
		return nil
	}
	m.stock[level.SKU] += delta
	return nil
}

func (m *memHolds) CreateGroup(_ context.Context, g Group) error {
	err := m.enter("CreateGroup")
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	m.groups[g.ID] = &g
	m.member[g.ID] = map[string]string{}
	return nil
}

func (m *memHolds) Group(_ context.Context, sku, id string) (Group, error) {
	err := m.enter("Group")
	defer m.mu.Unlock()
	if err != nil {
		return Group{}, err
	}
	g, ok := m.groups[id]
	if !ok || g.SKU != sku {
		return Group{}, ErrUnknownGroup
	}
	return *g, nil
}

func (m *memHolds) CloseGroup(_ context.Context, g Group) ([]string, error) {
	err := m.enter("CloseGroup")
	defer m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if mg, ok := m.groups[g.ID]; ok {
		mg.Status = GroupFailed
	}
	var ids []string
	for _, id := range m.member[g.ID] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

type memLedger struct {
	mu        sync.Mutex
	stock     map[string]*StockLevel
	rows      map[string]Reservation
	notified  map[string]bool
	groups    map[string]*Group
	members   map[string]map[string]string // group -> user -> id
	settled   map[string]bool
	fail      map[string]error
	conflicts int       // Apply answers ErrVersionConflict this many times first (even when locking: a deadlock)
	locked    []Locking // the mode of each Apply that reached the stock row
	calls     map[string]int
}

func newMemLedger() *memLedger {
	return &memLedger{
		stock: map[string]*StockLevel{}, rows: map[string]Reservation{}, notified: map[string]bool{},
		groups: map[string]*Group{}, members: map[string]map[string]string{}, settled: map[string]bool{},
		fail: map[string]error{}, calls: map[string]int{},
	}
}

func (l *memLedger) enter(name string) error {
	l.mu.Lock()
	l.calls[name]++
	return l.fail[name]
}

func (l *memLedger) row(id string) Reservation {
	r := l.rows[id]
	r.Notified = l.notified[id]
	return r
}

func (l *memLedger) Apply(_ context.Context, r Reservation, lock Locking, _ time.Time) (ApplyResult, Reservation, error) {
	err := l.enter("Apply")
	defer l.mu.Unlock()
	if err != nil {
		return 0, r, err
	}
	if _, ok := l.rows[r.ID]; ok {
		if l.rows[r.ID].Status == StatusConfirmed {
			return AlreadyConfirmed, l.row(r.ID), nil
		}
		return AlreadyCancelled, l.row(r.ID), nil
	}
	st, ok := l.stock[r.SKU]
	if !ok {
		return NoSuchSKU, r, nil
	}
	if st.Available < int64(r.Qty) {
		return Insufficient, r, nil
	}
	l.locked = append(l.locked, lock)
	if l.conflicts > 0 {
		l.conflicts--
		return 0, r, ErrVersionConflict
	}
	if r.GroupID != "" {
		g, ok := l.groups[r.GroupID]
		switch {
		case l.members[r.GroupID][r.UserID] != "":
			return GroupDuplicate, r, nil
		case !ok || g.Status != GroupOpen:
			return GroupNotOpen, r, nil
		case g.Members >= g.Capacity:
			return GroupNoSlot, r, nil
		}
		g.Members++
		if g.Members == g.Capacity {
			g.Status = GroupFormed
		}
		l.members[r.GroupID][r.UserID] = r.ID
	}
	st.Available -= int64(r.Qty)
	st.Version++
	r.Status = StatusConfirmed
	l.rows[r.ID] = r
	l.notified[r.ID] = true
	return Applied, r, nil
}

func (l *memLedger) ApplyBatch(_ context.Context, sku string, rs []Reservation, _ time.Time) ([]BatchResult, error) {
	err := l.enter("ApplyBatch")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if l.conflicts > 0 {
		l.conflicts--
		return nil, ErrVersionConflict
	}
	out := make([]BatchResult, len(rs))
	st, ok := l.stock[sku]
	for i, r := range rs {
		switch row, have := l.rows[r.ID]; {
		case !ok:
			out[i].Result = NoSuchSKU
		case have && row.Status == StatusConfirmed:
			out[i] = BatchResult{AlreadyConfirmed, l.row(r.ID)}
		case have:
			out[i] = BatchResult{AlreadyCancelled, l.row(r.ID)}
		case st.Available >= int64(r.Qty):
			st.Available -= int64(r.Qty)
			r.Status = StatusConfirmed
			l.rows[r.ID] = r
			l.notified[r.ID] = true
			out[i] = BatchResult{Applied, r}
		default:
			out[i] = BatchResult{Insufficient, r}
		}
	}
	if ok {
		st.Version++
	}
	return out, nil
}

func (l *memLedger) Fence(_ context.Context, r Reservation, reason Reason, _ time.Time) (Reservation, bool, error) {
	err := l.enter("Fence")
	defer l.mu.Unlock()
	if err != nil {
		return r, false, err
	}
	if _, ok := l.rows[r.ID]; ok {
		return l.row(r.ID), false, nil
	}
	r.Status, r.Reason = StatusCancelled, reason
	l.rows[r.ID] = r
	return l.row(r.ID), true, nil
}

func (l *memLedger) Refund(_ context.Context, id string, reason Reason, _ time.Time) (Reservation, bool, error) {
	err := l.enter("Refund")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, false, err
	}
	r, ok := l.rows[id]
	if !ok {
		return Reservation{}, false, ErrNotFound
	}
	if r.Status != StatusConfirmed {
		return l.row(id), false, nil
	}
	r.Status, r.Reason, r.Refunded = StatusCancelled, reason, true
	l.rows[id] = r
	l.notified[id] = false
	l.stock[r.SKU].Available += int64(r.Qty)
	l.stock[r.SKU].Version++
	if r.GroupID != "" {
		delete(l.members[r.GroupID], r.UserID)
		if g := l.groups[r.GroupID]; g != nil {
			g.Members--
			if g.Status == GroupFormed {
				g.Status = GroupOpen
			}
		}
	}
	return l.row(id), true, nil
}

func (l *memLedger) Reservation(_ context.Context, id string) (Reservation, error) {
	err := l.enter("Reservation")
	defer l.mu.Unlock()
	if err != nil {
		return Reservation{}, err
	}
	if _, ok := l.rows[id]; !ok {
		return Reservation{}, ErrNotFound
	}
	return l.row(id), nil
}

func (l *memLedger) MarkNotified(_ context.Context, id string) error {
	err := l.enter("MarkNotified")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	l.notified[id] = true
	return nil
}

func (l *memLedger) Unnotified(_ context.Context, _ time.Time, limit int) ([]Reservation, error) {
	err := l.enter("Unnotified")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for id, r := range l.rows {
		if r.Status == StatusCancelled && !l.notified[id] && len(out) < limit {
			out = append(out, l.row(id))
		}
	}
	return out, nil
}

func (l *memLedger) SetStock(_ context.Context, sku string, stock int64, limit *int) (StockLevel, int64, error) {
	err := l.enter("SetStock")
	defer l.mu.Unlock()
	if err != nil {
		return StockLevel{}, 0, err
	}
	st, ok := l.stock[sku]
	if !ok {
		st = &StockLevel{SKU: sku}
		l.stock[sku] = st
	}
	delta := stock - st.Available
	st.Available = stock
	st.Version++
	if limit != nil {
		st.PerUserLimit = *limit
	}
	return *st, delta, nil
}

func (l *memLedger) Stock(_ context.Context, sku string) (StockLevel, error) {
	err := l.enter("Stock")
	defer l.mu.Unlock()
	if err != nil {
		return StockLevel{}, err
	}
	st, ok := l.stock[sku]
	if !ok {
		return StockLevel{}, ErrUnknownSKU
	}
	return *st, nil
}

func (l *memLedger) Stocks(_ context.Context) ([]StockLevel, error) {
	err := l.enter("Stocks")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []StockLevel
	for _, st := range l.stock {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out, nil
}

func (l *memLedger) CreateGroup(_ context.Context, g Group) error {
	err := l.enter("CreateGroup")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := l.stock[g.SKU]; !ok {
		return ErrUnknownSKU
	}
	l.groups[g.ID] = &g
	l.members[g.ID] = map[string]string{}
	return nil
}

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
	return *g, nil
}

func (l *memLedger) DueGroups(_ context.Context, t time.Time, limit int) ([]Group, error) {
	err := l.enter("DueGroups")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Group
	for id, g := range l.groups {
		if (g.Status == GroupOpen && !g.Deadline.After(t)) || (g.Status == GroupFailed && !l.settled[id]) {
			out = append(out, *g)
		}
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

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
	if g.Status == GroupOpen && !g.Deadline.After(now) {
		g.Status = GroupFailed
	}
	return *g, nil
}

func (l *memLedger) GroupMembers(_ context.Context, id string) ([]Reservation, error) {
	err := l.enter("GroupMembers")
	defer l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for rid, r := range l.rows {
		if r.GroupID == id && r.Status == StatusConfirmed {
			out = append(out, l.row(rid))
		}
	}
	return out, nil
}

func (l *memLedger) GroupSettled(_ context.Context, id string) error {
	err := l.enter("GroupSettled")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	l.settled[id] = true
	return nil
}

type memQueue struct {
	mu   sync.Mutex
	sent []Reservation
	err  error
}

func (q *memQueue) Enqueue(_ context.Context, r Reservation) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	q.sent = append(q.sent, r)
	return nil
}

type memNotifier struct {
	mu     sync.Mutex
	events []Reservation
	err    error
}

func (n *memNotifier) Cancelled(_ context.Context, r Reservation) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	n.events = append(n.events, r)
	return nil
}

type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }
