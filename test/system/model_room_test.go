package system_test

// TestModelRoom is the model-based test of the waiting room
// (docs/design.md, "The waiting room"): a rapid state machine of its own,
// beside TestModel, on the real stack. Each case has one waiting-room SKU
// (one bucket, 1-6 units, an admit factor of 1, 1.5 or 2, a sale opening a
// few seconds to a minute ahead, sometimes a close) and buyers u1..u6. The
// actions: joins before and after the opening (and again: the same
// ticket), looks at the public status and at a ticket (one's own, one never
// joined, another buyer's), reserves with the ticket's admission (its
// retry a replay), without one, with another buyer's or a forged one,
// deliveries to persist, buyers' cancels, sweeps, and time passing (ticks,
// past an admission, past the holds, to the opening and the close). The
// room's service calls are made directly (Service.JoinQueue, QueueStatus,
// Ticket, Reserve with an Admission); messages are recorded and delivered
// as actions, and time moves only by the test clock, as in TestModel.
//
// The reference model is the admission rule: every look (a join, a status,
// a ticket, a sweep) lapses the admissions older than AdmitFor and admits
// in queue order while admitted-not-reserved ≤ ⌈(available + held) ×
// factor⌉ - held (each admission one unit: the SKU sets no per-user
// limit, and a reserve of 2 is limit_exceeded), from the opening until the close. The order of the tickets
// taken before the opening is drawn by the server: the model learns it at
// the first look after the opening (each of those tickets' own look, at
// the same instant, which admits nothing more) and holds it to being a
// permutation of exactly those tickets that never changes; after the
// opening it is arrival order. Every answer is predicted exactly
// (positions, through, length, each ticket's state and admission, what
// reserve answers, stock in both stores), and after every step the room's
// keys in Redis are read and held to the model and to R1-R4: admitted
// order is queue order (no holes below through, through only grows), a
// look admits nobody beyond ⌈(available + held) × factor⌉ - held, one hold per
// ticket, under the id its admission fixes. Every case ends at quiescence:
// every message delivered, past every hold and admission, a sweep; then no
// undersell (units left and tickets waiting: the admitted cover the
// units), Redis = MySQL, and the invariant checker.
//
// make test runs HOLDFAST_MODEL_ROOM_CHECKS cases (default 100) of about
// HOLDFAST_MODEL_ROOM_STEPS actions (default 50), about 10 s; more by hand:
//
//	HOLDFAST_MODEL_ROOM_CHECKS=500 scripts/test.sh -run 'TestModelRoom$' -v ./test/system
//
// A failure is shrunk (HOLDFAST_MODEL_SHRINKTIME, as TestModel) and printed
// one action per line, with -rapid.seed and a fail file to replay it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// roomAdmitFor is HOLDFAST_ADMIT_FOR, as the stack below sets it.
const roomAdmitFor = 2 * time.Minute

func TestModelRoom(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec), withVars(map[string]string{
		"HOLDFAST_RECONCILE_AFTER": "1s",
		"HOLDFAST_HOLD_RETENTION":  modelRetention.String(),
		"HOLDFAST_SOLD_OUT_TTL":    "0s", // as TestModel: time moves only when the test says
		"HOLDFAST_ADMIT_FOR":       roomAdmitFor.String(),
	}))
	setRapidFlag(t, "rapid.checks", "HOLDFAST_MODEL_ROOM_CHECKS", "100")
	setRapidFlag(t, "rapid.steps", "HOLDFAST_MODEL_ROOM_STEPS", "50")
	setRapidFlag(t, "rapid.shrinktime", "HOLDFAST_MODEL_SHRINKTIME", "90s")
	prefix := testservices.Name("mr")
	n := 0
	var drawn, asJoined int // cases with ≥ 3 tickets before the opening; of them, ordered as they joined
	seen := &roomSeen{}
	start := time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		n++
		m := newRoomMachine(rt, s, rec, fmt.Sprintf("%s-%d", prefix, n))
		m.seenAll = seen
		rt.Repeat(m.actions())
		m.quiesce(rt)
		if m.learned && len(m.pre) >= 3 {
			drawn++
			if m.orderAsJoined() {
				asJoined++
			}
		}
	})
	t.Logf("model room: %d cases in %v; %d drew the order of ≥ 3 tickets taken before the opening, %d of them as they joined",
		n, time.Since(start).Round(time.Millisecond), drawn, asJoined)
	t.Logf("model room: %d admitted, %d lapsed, %d held with an admission, %d replays; refused: %v; ticket states seen: %v",
		seen.admitted, seen.lapsed, seen.held, seen.replays, seen.refused, seen.states)
	// Each such draw keeps the joining order with probability ≤ 1/6.
	if drawn >= 6 && asJoined == drawn {
		t.Errorf("every one of %d opening orders was the joining order: the places before the opening are not drawn at random", drawn)
	}
}

// roomSeen counts what the cases reached, for the log: a model test that
// never reaches a state tests nothing there.
type roomSeen struct {
	admitted, lapsed, held, replays int
	refused                         map[string]int
	states                          map[reservation.TicketState]int
}

func (s *roomSeen) refusal(err error) {
	if s.refused == nil {
		s.refused = map[string]int{}
	}
	s.refused[err.Error()]++
}

func (s *roomSeen) state(st reservation.TicketState) {
	if s.states == nil {
		s.states = map[reservation.TicketState]int{}
	}
	s.states[st]++
}

// roomTicket is the model of one buyer's ticket.
type roomTicket struct {
	user, ticket string
	id           string // the reservation id its admission fixes
	joined       bool
	pre          bool // taken before the opening: its place is drawn
	arrival      int  // after the opening: its arrival number, from 1
	// admittedAt: admitted, not reserved yet and not lapsed by a look (zero otherwise)
	admittedAt time.Time
	done       string                // "R" reserved, "L" lapsed (the room's done hash), "" neither
	admission  reservation.Admission // the token its look gave (zero: none yet)
}

// roomMachine is one rapid case: TestModel's machine (MySQL, Redis's
// figures, the reservations and messages) with a waiting room beside it.
type roomMachine struct {
	*modelMachine
	svc      *reservation.Service
	permille int64 // the admit factor, in thousandths
	tickets  map[string]*roomTicket
	byID     map[string]*roomTicket
	// queue is the tickets in place order once the opening's order is
	// learned: those taken before (pre, in joining order), then arrivals.
	pre      []*roomTicket
	queue    []*roomTicket
	learned  bool
	arrivals int
	through  int
	seen     int64 // the through Redis had at the last check: it only grows
	// learnt is the answers of the looks that learned the opening's order,
	// checked once the step's look is applied to the model.
	learnt  []learntLook
	seenAll *roomSeen
}

type learntLook struct {
	tk *roomTicket
	q  reservation.QueueState
}

func newRoomMachine(t *rapid.T, s *stack, rec *recordingEnqueuer, sku string) *roomMachine {
	rec.mu.Lock()
	rec.msgs = nil
	rec.mu.Unlock()
	m := &modelMachine{
		s: s, rec: rec, sku: sku, exact: true, k: 1, transfersDone: map[string]bool{},
		buyers: []string{"u1", "u2", "u3", "u4", "u5", "u6"},
		units:  map[string]int{}, res: map[string]*modelRes{}, addKeys: map[string]int{},
	}
	t.Cleanup(m.retire)
	r := &roomMachine{modelMachine: m, svc: s.app.Service, tickets: map[string]*roomTicket{}, byID: map[string]*roomTicket{}}
	stock := int64(rapid.IntRange(1, 6).Draw(t, "stock"))
	factor := rapid.SampledFrom([]float64{1, 1.5, 2}).Draw(t, "admit_factor")
	r.permille = int64(factor * 1000)
	m.opens = m.now().Add(time.Duration(rapid.IntRange(3, 60).Draw(t, "opensIn_seconds")) * time.Second)
	on := true
	c := reservation.StockChange{SKU: sku, Set: &stock, WaitingRoom: &on, AdmitFactor: &factor, OpensAt: &m.opens}
	if rapid.Bool().Draw(t, "withClose") {
		m.closes = m.opens.Add(rapid.SampledFrom([]time.Duration{20 * time.Second, time.Minute, 150 * time.Second, 5 * time.Minute}).Draw(t, "openFor"))
		c.ClosesAt = &m.closes
	}
	l, err := r.svc.ChangeStock(context.Background(), c)
	if err != nil || int64(l.AdmitPermille) != r.permille || l.BucketCount() != 1 {
		m.fatalf(t, "create %s with a waiting room of factor %v = %+v %v", sku, factor, l, err)
	}
	m.available, m.sellable, m.stock = stock, stock, stock
	m.version, m.checkedAvail = l.Version, stock
	for _, u := range m.buyers {
		tk := &roomTicket{user: u, ticket: r.svc.TicketOf(sku, u)}
		tk.id = reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: u, IdempotencyKey: "admission:" + tk.ticket}, s.idSecret)
		r.tickets[u], r.byID[tk.id] = tk, tk
	}
	t.Logf("sku %s: stock %d, admit factor %v, opens in %v, closes %s", sku, stock, factor, m.opens.Sub(m.now()), r.at(m.closes))
	return r
}

func (r *roomMachine) actions() map[string]func(*rapid.T) {
	weighted := []struct {
		name   string
		weight int
		act    func(*rapid.T)
	}{
		{"join", 5, r.actJoin},
		{"status", 2, r.actStatus},
		{"ticket", 4, r.actTicket},
		{"ticketOfAnother", 1, r.actTicketOfAnother},
		{"lookAndBuy", 6, r.actLookAndBuy},
		{"reserve", 3, r.actReserve},
		{"reserveWithout", 1, r.actReserveWithout},
		{"reserveWithAnothers", 1, r.actReserveWithAnothers},
		{"reserveForged", 1, r.actReserveForged},
		{"deliver", 4, r.actDeliver},
		{"deliverBatch", 1, r.actDeliverBatch},
		{"redeliver", 1, r.actRedeliver},
		{"cancel", 2, r.actCancel},
		{"sweep", 2, r.actSweep},
		{"timeTick", 3, r.actTimeTick},
		{"timePastAdmission", 2, r.actTimePastAdmission},
		{"timePastHolds", 1, r.actTimePastHolds},
		{"timeToOpening", 2, r.actTimeToOpening},
		{"timeToClose", 1, r.actTimeToClose},
	}
	out := map[string]func(*rapid.T){"": r.check}
	for _, w := range weighted {
		for i := range w.weight {
			name := w.name
			if i > 0 {
				name = fmt.Sprintf("%s#%d", w.name, i+1)
			}
			out[name] = w.act
		}
	}
	return out
}

// ---- the model ----

func (r *roomMachine) open() bool   { return !r.now().Before(r.opens) }
func (r *roomMachine) closed() bool { return !r.closes.IsZero() && !r.now().Before(r.closes) }

// at shows a time relative to the opening, the same on every replay.
func (r *roomMachine) at(x time.Time) string {
	if x.IsZero() {
		return "-"
	}
	if d := x.Sub(r.opens); d < 0 {
		return "opening" + d.String()
	}
	return "opening+" + x.Sub(r.opens).String()
}

// fatalf is modelMachine.fatalf with tickets and tokens named by buyer.
func (r *roomMachine) fatalf(t *rapid.T, format string, args ...any) {
	t.Helper()
	s := fmt.Sprintf(format, args...)
	for _, tk := range r.tickets {
		if tk.admission.Token != "" {
			s = strings.ReplaceAll(s, tk.admission.Token, "admission("+tk.user+")")
		}
		s = strings.ReplaceAll(s, tk.ticket, "ticket("+tk.user+")")
	}
	r.modelMachine.fatalf(t, "%s", s)
}

func (r *roomMachine) length() int { return len(r.pre) + r.arrivals }

// admittedNow counts the admitted tickets that have not reserved or lapsed.
func (r *roomMachine) admittedNow() int64 {
	var n int64
	for _, tk := range r.tickets {
		if !tk.admittedAt.IsZero() {
			n++
		}
	}
	return n
}

// serves is how many admitted buyers who have not reserved the stock can
// serve now: ⌈(available + held) × factor⌉ - held, since a held unit's
// holder is one of the buyers its factor stands for.
func (r *roomMachine) serves() int64 {
	h := max(r.held, 0)
	return (max(r.stock, 0)*r.permille+h*r.permille+999)/1000 - h
}

// join applies a join the system accepted (the ticket was not queued).
func (r *roomMachine) join(tk *roomTicket) {
	tk.joined = true
	if !r.open() {
		tk.pre = true
		r.pre = append(r.pre, tk)
		return
	}
	r.arrivals++
	tk.arrival = r.arrivals
	r.queue = append(r.queue, tk)
}

// look is queue.lua's admission: from the opening on, the admissions
// AdmitFor old lapse (after the close too); then, until the close, tickets
// are admitted in place order while the admitted who have not reserved ≤
// ⌈(available + held) × factor⌉ - held. It returns how many it admitted.
func (r *roomMachine) look(t *rapid.T) int {
	if !r.open() {
		return 0
	}
	now := r.now()
	var lapsed []string
	for _, tk := range r.queue[:r.through] {
		if !tk.admittedAt.IsZero() && !now.Before(tk.admittedAt.Add(roomAdmitFor)) {
			tk.admittedAt, tk.done = time.Time{}, "L"
			lapsed = append(lapsed, tk.user)
			r.seenAll.lapsed++
		}
	}
	n := 0
	var admitted []string
	for budget := r.serves() - r.admittedNow(); !r.closed() && budget > 0 && r.through < len(r.queue); budget-- {
		tk := r.queue[r.through]
		tk.admittedAt = now
		r.through++
		n++
		admitted = append(admitted, tk.user)
		r.seenAll.admitted++
	}
	if len(lapsed)+len(admitted) > 0 {
		t.Logf("  lapsed %v, admitted %v: through %d of %d", lapsed, admitted, r.through, r.length())
	}
	return n
}

// position is the ticket's place from 1 once the sale opened, 0 before.
func (r *roomMachine) position(tk *roomTicket) int64 {
	if !r.open() {
		return 0
	}
	return int64(slices.Index(r.queue, tk) + 1)
}

// state is the ticket's state as a look shows it after admitting.
func (r *roomMachine) state(tk *roomTicket) reservation.TicketState {
	switch {
	case !tk.joined:
		return reservation.TicketNone
	case tk.done == "R":
		return reservation.TicketReserved
	case tk.done == "L":
		return reservation.TicketExpired
	case !tk.admittedAt.IsZero():
		return reservation.TicketAdmitted
	case r.closed():
		return reservation.TicketClosed
	case r.open() && r.stock <= 0 && r.held <= 0:
		return reservation.TicketSoldOut
	}
	return reservation.TicketWaiting
}

// looked follows a look the system made (the action's): the opening's
// order is learned at the first look after it, then a join it made
// (joined, not nil) and its admission are applied, and R1 checked: a look
// admits nobody beyond what the stock can serve.
func (r *roomMachine) looked(t *rapid.T, what string, joined *roomTicket) {
	t.Helper()
	r.learn(t)
	if joined != nil {
		r.join(joined)
	}
	if n := r.look(t); n > 0 {
		if got := r.redisAdmitted(t); got > r.serves() {
			r.fatalf(t, "R1: %s admitted %d: %d admitted and not reserved, but the stock (available %d + held %d, factor %d‰) serves %d more",
				what, n, got, r.stock, r.held, r.permille, r.serves())
		}
	}
	for _, l := range r.learnt {
		r.wantQueue(t, "the look at "+l.tk.user+" that learned the opening's order", l.q, l.tk)
	}
	r.learnt = nil
}

// learn reads the opening's order at the first look after it: each ticket
// taken before it looks at itself (at the same instant: it admits nothing
// more); their places must be exactly 1..P.
func (r *roomMachine) learn(t *rapid.T) {
	t.Helper()
	if r.learned || !r.open() {
		return
	}
	r.learned = true
	order := make([]*roomTicket, len(r.pre))
	for _, tk := range r.pre {
		q, _, err := r.svc.Ticket(context.Background(), tk.user, r.sku, tk.ticket)
		if err != nil {
			r.fatalf(t, "the look at %s after the opening: %v", tk.user, err)
		}
		if q.Position < 1 || q.Position > int64(len(r.pre)) {
			r.fatalf(t, "after the opening %s is at %d: the %d tickets taken before it must hold places 1..%d", tk.user, q.Position, len(r.pre), len(r.pre))
		}
		if o := order[q.Position-1]; o != nil {
			r.fatalf(t, "after the opening %s and %s are both at %d: the places 1..%d must be a permutation", o.user, tk.user, q.Position, len(r.pre))
		}
		order[q.Position-1] = tk
		r.learnt = append(r.learnt, learntLook{tk, q})
	}
	r.queue = append(order, r.queue...)
	var names []string
	for _, tk := range order {
		names = append(names, tk.user)
	}
	if len(order) > 0 {
		t.Logf("  the opening's order: %v", names)
	}
}

// orderAsJoined reports whether the opening's order is the joining order.
func (r *roomMachine) orderAsJoined() bool {
	for i, tk := range r.pre {
		if r.queue[i] != tk {
			return false
		}
	}
	return true
}

// wantQueue checks a look's answer (tk nil: the public status).
func (r *roomMachine) wantQueue(t *rapid.T, what string, q reservation.QueueState, tk *roomTicket) {
	t.Helper()
	want := reservation.QueueState{
		SKU: r.sku, Now: r.now(), OpensAt: r.opens, ClosesAt: r.closes,
		Through: int64(r.through), Length: int64(r.length()), Available: r.stock, Held: r.held,
	}
	if tk != nil {
		want.Ticket, want.Position, want.State, want.AdmittedAt = tk.ticket, r.position(tk), r.state(tk), tk.admittedAt
	}
	if tk != nil {
		r.seenAll.state(want.State)
	}
	if q.SKU != want.SKU || !q.Now.Equal(want.Now) || !q.OpensAt.Equal(want.OpensAt) || !q.ClosesAt.Equal(want.ClosesAt) ||
		q.Through != want.Through || q.Length != want.Length || q.Available != want.Available || q.Held != want.Held ||
		q.Ticket != want.Ticket || q.Position != want.Position || q.State != want.State || !q.AdmittedAt.Equal(want.AdmittedAt) {
		r.fatalf(t, "%s = %s, want %s", what, r.showQueue(q), r.showQueue(want))
	}
}

func (r *roomMachine) showQueue(q reservation.QueueState) string {
	s := fmt.Sprintf("{now %s, through %d of %d, available %d held %d", r.at(q.Now), q.Through, q.Length, q.Available, q.Held)
	if q.Ticket != "" {
		s += fmt.Sprintf(", %s at %d %s admitted %s", q.Ticket, q.Position, q.State, r.at(q.AdmittedAt))
	}
	if !q.OpensAt.Equal(r.opens) || !q.ClosesAt.Equal(r.closes) {
		s += fmt.Sprintf(", window %s..%s", r.at(q.OpensAt), r.at(q.ClosesAt))
	}
	return s + "}"
}

// wantAdmission checks the admission a ticket's look gave, and keeps it.
func (r *roomMachine) wantAdmission(t *rapid.T, what string, tk *roomTicket, a reservation.Admission) {
	t.Helper()
	if tk.admittedAt.IsZero() || r.state(tk) != reservation.TicketAdmitted {
		if a != (reservation.Admission{}) {
			r.fatalf(t, "%s gave an admission %+v to a ticket %s", what, a, r.state(tk))
		}
		return
	}
	exp := tk.admittedAt.Add(roomAdmitFor)
	ms, _, ok := strings.Cut(a.Token, ".")
	if !a.Expires.Equal(exp) || !ok || ms != fmt.Sprint(exp.UnixMilli()) {
		r.fatalf(t, "%s: admission %q until %s, want one until %s (admitted %s + %v)", what, a.Token, r.at(a.Expires), r.at(exp), r.at(tk.admittedAt), roomAdmitFor)
	}
	if tk.admission.Token != "" && tk.admission != a {
		r.fatalf(t, "%s: admission %+v, but it was %+v: one admission a ticket", what, a, tk.admission)
	}
	tk.admission = a
}

// ---- the room's actions ----

func (r *roomMachine) drawTicket(t *rapid.T) *roomTicket {
	return r.tickets[rapid.SampledFrom(r.buyers).Draw(t, "user")]
}

func (r *roomMachine) actJoin(t *rapid.T) {
	tk := r.drawTicket(t)
	q, err := r.svc.JoinQueue(context.Background(), tk.user, r.sku)
	t.Logf("join %s → %s %v", tk.user, q.State, err)
	what := "join " + tk.user
	if !tk.joined && r.closed() {
		if !errors.Is(err, reservation.ErrSaleClosed) {
			r.fatalf(t, "%s after the close = %s %v, want ErrSaleClosed", what, r.showQueue(q), err)
		}
		return
	}
	if err != nil {
		r.fatalf(t, "%s: %v", what, err)
	}
	var joined *roomTicket
	if !tk.joined {
		joined = tk
	}
	r.looked(t, what, joined)
	r.wantQueue(t, what, q, tk)
}

func (r *roomMachine) actStatus(t *rapid.T) {
	q, err := r.svc.QueueStatus(context.Background(), r.sku)
	t.Logf("status → through %d of %d %v", q.Through, q.Length, err)
	if err != nil {
		r.fatalf(t, "status: %v", err)
	}
	r.looked(t, "status", nil)
	r.wantQueue(t, "status", q, nil)
}

// lookTicket is a buyer's look at their own ticket: one never joined is
// ErrUnknownTicket (after the look, which admits like any).
func (r *roomMachine) lookTicket(t *rapid.T, tk *roomTicket) {
	t.Helper()
	q, a, err := r.svc.Ticket(context.Background(), tk.user, r.sku, tk.ticket)
	t.Logf("ticket of %s → %s at %d %v", tk.user, q.State, q.Position, err)
	what := "the ticket of " + tk.user
	r.looked(t, what, nil)
	if !tk.joined {
		if !errors.Is(err, reservation.ErrUnknownTicket) {
			r.fatalf(t, "%s, never joined = %s %v, want ErrUnknownTicket", what, r.showQueue(q), err)
		}
		return
	}
	if err != nil {
		r.fatalf(t, "%s: %v", what, err)
	}
	r.wantQueue(t, what, q, tk)
	r.wantAdmission(t, what, tk, a)
}

func (r *roomMachine) actTicket(t *rapid.T) { r.lookTicket(t, r.drawTicket(t)) }

// actTicketOfAnother: a buyer asks for another's ticket: ErrUnknownTicket,
// and no look (the ticket is checked before Redis is asked).
func (r *roomMachine) actTicketOfAnother(t *rapid.T) {
	tk := r.drawTicket(t)
	other := r.tickets[rapid.SampledFrom(slices.DeleteFunc(slices.Clone(r.buyers), func(u string) bool { return u == tk.user })).Draw(t, "other")]
	q, a, err := r.svc.Ticket(context.Background(), tk.user, r.sku, other.ticket)
	t.Logf("%s asks for the ticket of %s → %v", tk.user, other.user, err)
	if !errors.Is(err, reservation.ErrUnknownTicket) || q != (reservation.QueueState{}) || a != (reservation.Admission{}) {
		r.fatalf(t, "%s asks for the ticket of %s = %s %+v %v, want ErrUnknownTicket and nothing else", tk.user, other.user, r.showQueue(q), a, err)
	}
}

// actLookAndBuy is a waiter's client: it looks at its ticket and, when
// admitted, reserves with the admission at once.
func (r *roomMachine) actLookAndBuy(t *rapid.T) {
	var joined []string
	for _, u := range r.buyers {
		if r.tickets[u].joined {
			joined = append(joined, u)
		}
	}
	if len(joined) == 0 {
		t.SkipNow() // nobody queues
	}
	tk := r.tickets[rapid.SampledFrom(joined).Draw(t, "user")]
	r.lookTicket(t, tk)
	if tk.admission.Token == "" || r.state(tk) != reservation.TicketAdmitted {
		return
	}
	r.reserve(t, tk.user, tk.admission.Token, r.drawQty(t), "own")
}

func (r *roomMachine) drawQty(t *rapid.T) int {
	return rapid.SampledFrom([]int{1, 1, 1, 2}).Draw(t, "qty")
}

// actReserve reserves with a ticket's admission: its first use, a retry
// (a replay), one past its time, or with another qty (a mismatch once held).
func (r *roomMachine) actReserve(t *rapid.T) {
	var with []*roomTicket
	for _, u := range r.buyers {
		if tk := r.tickets[u]; tk.admission.Token != "" {
			with = append(with, tk)
		}
	}
	if len(with) == 0 {
		t.SkipNow() // no admission given yet
	}
	tk := rapid.SampledFrom(with).Draw(t, "ticket")
	r.reserve(t, tk.user, tk.admission.Token, r.drawQty(t), "own")
}

func (r *roomMachine) actReserveWithout(t *rapid.T) {
	r.reserve(t, r.drawTicket(t).user, "", 1, "none")
}

func (r *roomMachine) actReserveWithAnothers(t *rapid.T) {
	var with []*roomTicket
	for _, u := range r.buyers {
		if tk := r.tickets[u]; tk.admission.Token != "" {
			with = append(with, tk)
		}
	}
	if len(with) == 0 {
		t.SkipNow() // no admission given yet
	}
	tk := rapid.SampledFrom(with).Draw(t, "ticket")
	user := rapid.SampledFrom(slices.DeleteFunc(slices.Clone(r.buyers), func(u string) bool { return u == tk.user })).Draw(t, "user")
	r.reserve(t, user, tk.admission.Token, 1, "another's")
}

// actReserveForged: a buyer's own admission with its expiry moved (or a
// made-up one): the MAC does not match.
func (r *roomMachine) actReserveForged(t *rapid.T) {
	tk := r.drawTicket(t)
	exp := r.now().Add(time.Minute)
	sig := "AAAAAAAAAAAAAAAAAAAAAA"
	if tk.admission.Token != "" {
		exp = tk.admission.Expires.Add(time.Hour)
		_, sig, _ = strings.Cut(tk.admission.Token, ".")
	}
	r.reserve(t, tk.user, fmt.Sprintf("%d.%s", exp.UnixMilli(), sig), 1, "forged")
}

// reserve sends Service.Reserve with token (how: "own", "none",
// "another's", "forged") and checks the answer against the model.
func (r *roomMachine) reserve(t *rapid.T, user, token string, qty int, how string) {
	t.Helper()
	m := r.modelMachine
	tk := r.tickets[user]
	before := m.sent()
	got, replayed, err := r.svc.Reserve(context.Background(), reservation.ReserveRequest{SKU: m.sku, Qty: qty, UserID: user, Admission: token})
	msgs := m.sentSince(before)
	what := fmt.Sprintf("reserve %s qty %d with %s admission", user, qty, how)
	if err != nil {
		t.Logf("%s → %v", what, err)
	} else {
		t.Logf("%s → %s %s replayed %v", what, got.Status, got.Reason, replayed)
	}
	refused := func(want error) {
		t.Helper()
		if !errors.Is(err, want) || len(msgs) != 0 {
			r.fatalf(t, "%s = %+v %v (%d messages), want %v and nothing sent", what, got, err, len(msgs), want)
		}
		r.seenAll.refusal(want)
	}
	x := m.res[tk.id]
	switch {
	case how == "another's" || how == "forged":
		refused(reservation.ErrAdmissionInvalid)
	case how == "none" && !r.open():
		refused(reservation.ErrNotOpen)
	case how == "none" && r.closed():
		refused(reservation.ErrSaleClosed)
	case how == "none":
		refused(reservation.ErrAdmissionRequired)
	case x != nil && x.hold != "" && x.holdQty != qty:
		refused(reservation.ErrIdempotencyMismatch)
	case x != nil && x.hold == mHeld:
		// A retry: a replay of the hold, sent again (the first send may have been lost).
		if err != nil || !replayed || got.ID != x.id || got.Status != reservation.StatusHeld || got.Qty != x.holdQty {
			r.fatalf(t, "%s, a retry of %s = %+v replayed %v %v, want its HELD hold replayed", what, x, got, replayed, err)
		}
		r.oneMessage(t, what, msgs, x)
		r.seenAll.replays++
	case x != nil && x.hold != "":
		if err != nil || !replayed || got.ID != x.id || string(got.Status) != x.row || string(got.Reason) != x.reason || got.Qty != x.rowQty {
			r.fatalf(t, "%s, a retry of %s = %+v replayed %v %v, want %s %s qty %d replayed", what, x, got, replayed, err, x.row, x.reason, x.rowQty)
		}
		if len(msgs) != 0 {
			r.fatalf(t, "%s: a replay of a decided hold sent %d messages", what, len(msgs))
		}
		r.seenAll.replays++
	case r.closed():
		refused(reservation.ErrSaleClosed)
	case !r.open():
		refused(reservation.ErrNotOpen)
	case !r.now().Before(tk.admission.Expires), tk.admittedAt.IsZero():
		// Past the token's time (a retry of a reserve held in time replays:
		// above), or lapsed in Redis.
		refused(reservation.ErrAdmissionExpired)
	case qty > 1:
		refused(reservation.ErrLimitExceeded) // an admission is for one unit (the SKU sets no per-user limit)
	case m.stock < int64(qty):
		refused(reservation.ErrSoldOut) // admitted while held units may return
	default:
		if x != nil {
			r.fatalf(t, "model: %s holds a second time", tk.user)
		}
		if err != nil || replayed || got.ID != tk.id || got.Status != reservation.StatusHeld || got.Qty != qty {
			r.fatalf(t, "%s = %+v replayed %v %v, want a new HELD hold of %d under the admission's id", what, got, replayed, err, qty)
		}
		x = m.newRes(tk.id, user, "admission")
		t.Logf("  = %s", x)
		x.accepted, x.qty = true, qty
		x.hold, x.holdQty, x.deadline = mHeld, qty, m.now().Add(modelHoldTTL)
		m.stock -= int64(qty)
		m.held += int64(qty)
		m.units[user] += qty
		tk.admittedAt, tk.done = time.Time{}, "R"
		if got.ExpiresAt.Sub(x.deadline).Abs() > time.Second {
			r.fatalf(t, "%s: expires at %s, want about %s", what, r.at(got.ExpiresAt), r.at(x.deadline))
		}
		r.oneMessage(t, what, msgs, x)
		r.seenAll.held++
	}
}

func (r *roomMachine) oneMessage(t *rapid.T, what string, msgs []reservation.Reservation, x *modelRes) {
	t.Helper()
	if len(msgs) != 1 || msgs[0].ID != x.id || msgs[0].Qty != x.holdQty || msgs[0].UserID != x.user {
		r.fatalf(t, "%s: sent %+v, want one message for %s qty %d", what, msgs, x, x.holdQty)
	}
	r.pending = append(r.pending, modelMsg{r: msgs[0], res: x})
}

func (r *roomMachine) actDeliver(t *rapid.T)      { r.modelMachine.actDeliver(t) }
func (r *roomMachine) actDeliverBatch(t *rapid.T) { r.modelMachine.actDeliverBatch(t) }
func (r *roomMachine) actRedeliver(t *rapid.T)    { r.modelMachine.actRedeliver(t) }

// actCancel is a buyer's cancel (Service.Cancel) of their reservation.
func (r *roomMachine) actCancel(t *rapid.T) {
	acc := r.accepted()
	if len(acc) == 0 {
		t.SkipNow() // nothing accepted
	}
	x := recent(t, acc, "reservation")
	got, err := r.svc.Cancel(context.Background(), x.id, x.user)
	t.Logf("cancel %s → %s %s %v", x, got.Status, got.Reason, err)
	code, status, reason := r.expectCancel(x)
	switch {
	case code == 404 && errors.Is(err, reservation.ErrNotFound):
	case code == 200 && err == nil && string(got.Status) == status && string(got.Reason) == reason && got.ID == x.id:
	default:
		r.fatalf(t, "cancel %s = %+v %v, want %d %s %s", x, got, err, code, status, reason)
	}
}

// sweep runs the sweeper (TestModel's sweep), whose visit of the SKU ends
// with a look at its room.
func (r *roomMachine) sweep(t *rapid.T) reservation.SweepReport {
	rep := r.modelMachine.sweep(t, "sweep")
	r.looked(t, "the sweep", nil)
	return rep
}

func (r *roomMachine) actSweep(t *rapid.T) { r.sweep(t) }

func (r *roomMachine) actTimeTick(t *rapid.T) {
	r.advance(t, time.Duration(rapid.IntRange(1, 20).Draw(t, "seconds"))*time.Second)
}

// edge draws where to land near an instant: just before, on it, or past it.
func edge(t *rapid.T) time.Duration {
	return rapid.SampledFrom([]time.Duration{-time.Millisecond, 0, time.Second}).Draw(t, "edge")
}

// actTimePastAdmission moves time to an admission's end: AdmitFor after it.
func (r *roomMachine) actTimePastAdmission(t *rapid.T) {
	var ends []time.Time
	for _, u := range r.buyers {
		if tk := r.tickets[u]; !tk.admittedAt.IsZero() && tk.admittedAt.Add(roomAdmitFor).After(r.now()) {
			ends = append(ends, tk.admittedAt.Add(roomAdmitFor))
		}
	}
	if len(ends) == 0 {
		t.SkipNow() // no admission to pass
	}
	slices.SortFunc(ends, time.Time.Compare)
	if d := rapid.SampledFrom(ends).Draw(t, "admissionEnd").Sub(r.now()) + edge(t); d > 0 {
		r.advance(t, d)
	}
}

func (r *roomMachine) actTimePastHolds(t *rapid.T) { r.modelMachine.actTimePastHolds(t) }

func (r *roomMachine) actTimeToOpening(t *rapid.T) {
	if r.open() {
		t.SkipNow() // open already
	}
	if d := r.opens.Sub(r.now()) + edge(t); d > 0 {
		r.advance(t, d)
	}
}

func (r *roomMachine) actTimeToClose(t *rapid.T) {
	if r.closes.IsZero() || r.closed() {
		t.SkipNow() // no close ahead
	}
	if d := r.closes.Sub(r.now()) + edge(t); d > 0 {
		r.advance(t, d)
	}
}

// ---- checks ----

// check runs after every action: TestModel's check (MySQL exactly, Redis's
// figures) and the room's keys in Redis against the model and R1-R4.
func (r *roomMachine) check(t *rapid.T) {
	t.Helper()
	r.modelMachine.check(t)
	r.checkRoom(t)
}

func (r *roomMachine) roomKey(suffix string) string {
	return "hf:{" + reservation.BucketName(r.sku, 0) + "}:" + suffix
}

// redisAdmitted is how many tickets Redis has admitted, not reserved and
// not lapsed.
func (r *roomMachine) redisAdmitted(t *rapid.T) int64 {
	n, err := r.s.redis().ZCard(context.Background(), r.roomKey("qa")).Result()
	if err != nil {
		r.fatalf(t, "redis admitted: %v", err)
	}
	return n
}

// checkRoom reads the room's keys (no look: reading admits nobody) and
// holds them to the model: the queue's tickets and places, through, the
// admitted and their times, the done; and to the invariants.
func (r *roomMachine) checkRoom(t *rapid.T) {
	t.Helper()
	ctx := context.Background()
	rdb := r.s.redis()
	queue, err := rdb.ZRangeWithScores(ctx, r.roomKey("q"), 0, -1).Result()
	if err != nil {
		r.fatalf(t, "redis queue: %v", err)
	}
	through, err := rdb.HGet(ctx, r.roomKey("qm"), "through").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.fatalf(t, "redis through: %v", err)
	}
	admitted, err := rdb.ZRangeWithScores(ctx, r.roomKey("qa"), 0, -1).Result()
	if err != nil {
		r.fatalf(t, "redis admitted: %v", err)
	}
	done, err := rdb.HGetAll(ctx, r.roomKey("qd")).Result()
	if err != nil {
		r.fatalf(t, "redis done: %v", err)
	}
	// The queue: exactly the joined tickets, at their places.
	if len(queue) != r.length() {
		r.fatalf(t, "Redis queues %d tickets, model %d", len(queue), r.length())
	}
	places := map[float64]string{}
	for i, z := range queue {
		tk := r.ticketNamed(t, z.Member.(string), "queue")
		other, twice := places[z.Score]
		places[z.Score] = tk.user
		switch {
		case twice:
			r.fatalf(t, "%s and %s have one place, %v: places are drawn (before the opening) or counted (after)", other, tk.user, z.Score)
		case !tk.joined:
			r.fatalf(t, "Redis queues %s, who never joined", tk.user)
		case tk.pre && (z.Score < 0 || z.Score >= 1):
			r.fatalf(t, "%s joined before the opening, at place %v: want a fraction in [0, 1)", tk.user, z.Score)
		case !tk.pre && z.Score != float64(1+tk.arrival):
			r.fatalf(t, "%s arrived %d. after the opening, at place %v: want %d", tk.user, tk.arrival, z.Score, 1+tk.arrival)
		case r.learned && r.queue[i] != tk:
			r.fatalf(t, "R3: Redis has %s at %d, but the order was %s at %d (an order learned never changes)", tk.user, i+1, r.queue[i].user, i+1)
		}
	}
	// through: only grows, and every place below it was admitted (admitted
	// order is queue order), each either still admitted or done.
	if through < r.seen {
		r.fatalf(t, "R3: through went back from %d to %d", r.seen, through)
	}
	r.seen = through
	if through != int64(r.through) || through > int64(len(queue)) {
		r.fatalf(t, "Redis through %d (of %d), model %d", through, len(queue), r.through)
	}
	inAdmitted := map[string]bool{}
	for _, z := range admitted {
		tk := r.ticketNamed(t, z.Member.(string), "admitted")
		inAdmitted[tk.ticket] = true
		if tk.admittedAt.IsZero() || int64(z.Score) != tk.admittedAt.UnixMilli() {
			r.fatalf(t, "Redis has %s admitted at %s; model: admitted %s (%s)", tk.user, r.at(time.UnixMilli(int64(z.Score))), r.at(tk.admittedAt), r.state(tk))
		}
	}
	if int64(len(admitted)) != r.admittedNow() {
		r.fatalf(t, "Redis has %d admitted, model %d", len(admitted), r.admittedNow())
	}
	for ticket, d := range done {
		tk := r.ticketNamed(t, ticket, "done")
		if d != tk.done || inAdmitted[ticket] {
			r.fatalf(t, "Redis has %s done %q (admitted %v); model %q", tk.user, d, inAdmitted[ticket], tk.done)
		}
	}
	for i, z := range queue {
		tk := r.byTicket(z.Member.(string))
		was := inAdmitted[tk.ticket] || done[tk.ticket] != ""
		if was != (int64(i) < through) {
			r.fatalf(t, "R3: %s at place %d admitted %v (through %d): admitted order must be queue order", tk.user, i+1, was, through)
		}
		if (done[tk.ticket] == "R") != (r.res[tk.id] != nil) {
			r.fatalf(t, "R4: %s is done %q, its reservation %v", tk.user, done[tk.ticket], r.res[tk.id])
		}
	}
	// R4: every hold of the SKU is a ticket's, under the id its admission fixes.
	iter := rdb.Scan(ctx, 0, `hf:\{`+reservation.BucketName(r.sku, 0)+`\}:r:*`, 100).Iterator()
	for iter.Next(ctx) {
		id := strings.TrimPrefix(iter.Val(), r.roomKey("r:"))
		if tk := r.byID[id]; tk == nil || tk.done != "R" {
			r.fatalf(t, "R4: Redis holds %s, which is no reserved ticket's admission", id)
		}
	}
	if err := iter.Err(); err != nil {
		r.fatalf(t, "scan holds: %v", err)
	}
}

func (r *roomMachine) byTicket(ticket string) *roomTicket {
	for _, tk := range r.tickets {
		if tk.ticket == ticket {
			return tk
		}
	}
	return nil
}

func (r *roomMachine) ticketNamed(t *rapid.T, ticket, where string) *roomTicket {
	t.Helper()
	tk := r.byTicket(ticket)
	if tk == nil {
		r.fatalf(t, "Redis's %s has %q, nobody's ticket", where, ticket)
	}
	return tk
}

// quiesce settles the case: every message delivered, past every hold and
// admission, a sweep (which decides the holds and looks); then no
// undersell, the stores agreeing, and the invariant checker.
func (r *roomMachine) quiesce(t *rapid.T) {
	m := r.modelMachine
	t.Logf("-- quiescence --")
	for len(m.pending) > 0 {
		m.deliver(t, "deliver", []modelMsg{m.takePending(0)})
	}
	m.advance(t, roomAdmitFor+time.Minute) // past every hold (60 s + grace) and admission
	r.sweep(t)
	r.check(t)
	for _, x := range m.accepted() {
		if x.row == "" {
			r.fatalf(t, "I4: accepted %s is still undecided after every deadline", x)
		}
	}
	stock, held, _ := m.redisFigures(t)
	if held != 0 || stock != m.available {
		r.fatalf(t, "quiescent: Redis stock %d held %d, MySQL available %d", stock, held, m.available)
	}
	// R2: every admission has lapsed and the sweep looked: units left and
	// tickets waiting, the admitted cover the units.
	waiting := int64(r.length() - r.through)
	if adm := r.redisAdmitted(t); r.open() && !r.closed() && stock > 0 && waiting > 0 && adm < stock {
		r.fatalf(t, "R2: %d units left and %d tickets waiting after every admission lapsed and a sweep looked, but %d admitted", stock, waiting, adm)
	}
	for range 3 {
		m.advance(t, 2*time.Second) // past HOLDFAST_RECONCILE_AFTER
		if rep := r.sweep(t); driftOf(rep, m.sku) != 0 {
			r.fatalf(t, "quiescent: drift %d", driftOf(rep, m.sku))
		}
	}
	r.check(t)
	var ids []string
	for _, x := range m.accepted() {
		ids = append(ids, x.id)
	}
	vs, err := invariant.Check(context.Background(), m.s.db, redisstore.New(m.s.redis(), 0), invariant.Expect{
		Sellable: map[string]int64{m.sku: m.sellable}, Accepted: ids, Quiescent: true,
	})
	if err != nil {
		r.fatalf(t, "invariant check: %v", err)
	}
	if len(vs) > 0 {
		r.fatalf(t, "invariants broken:\n%s", invariant.Violations(vs))
	}
}
