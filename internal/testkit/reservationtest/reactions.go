package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// UserUnits reads a buyer's per-user units in a bucket, for the Reactions
// suite; a HoldsUnderTest that has it is held to React's Users too.
type UserUnits interface {
	UserUnits(ctx context.Context, sku, user string) (int64, error)
}

// A reaction case: a hold set up through the port, then one decided row.
type reactionCase struct {
	name  string
	hold  holdSetup
	group groupSetup
	row   rowSetup
	lost  bool // Redis loses the bucket's stock figure before the row arrives
}

// holdSetup is what Redis has for the id before the row arrives.
type holdSetup struct {
	name  string
	state reservation.Status // "" none
	stray bool               // taken under another token than the row's
	sent  bool               // a join accepted (AcceptJoin)
	// elsewhere: the stray is a join of another group (g2) than the row's,
	// in the same state as the row's group (open, late or formed; open for
	// a buy's row).
	elsewhere bool
}

// groupSetup is the join's group before the row arrives ("" : a buy).
type groupSetup struct {
	name   string
	formed bool // FORMED in Redis
	late   bool // Redis's now is past the deadline
}

// rowSetup is MySQL's decided row.
type rowSetup struct {
	name     string
	status   reservation.Status
	reason   reservation.Reason
	how      reservation.Cancellation
	release  reservation.ReleaseState
	version  int64 // Follow's version (CONFIRMED)
	refundAt int64 // the row's RefundVersion
}

// The bucket is warmed from this version: rows and refunds are newer or older.
const warmedAt = 5

var (
	holdSetups = []holdSetup{
		{name: "no hold"},
		{name: "HELD", state: reservation.StatusHeld},
		{name: "HELD stray", state: reservation.StatusHeld, stray: true},
		{name: "CONFIRMED", state: reservation.StatusConfirmed},
		{name: "CONFIRMED stray", state: reservation.StatusConfirmed, stray: true},
		{name: "CANCELLED", state: reservation.StatusCancelled},
		{name: "CANCELLED stray", state: reservation.StatusCancelled, stray: true},
		{name: "HELD stray join of a group", state: reservation.StatusHeld, stray: true, sent: true, elsewhere: true},
	}
	joinSetups = []holdSetup{
		{name: "no hold"},
		{name: "HELD unsent", state: reservation.StatusHeld},
		{name: "HELD sent", state: reservation.StatusHeld, sent: true},
		{name: "HELD stray", state: reservation.StatusHeld, stray: true, sent: true},
		{name: "HELD stray in another group", state: reservation.StatusHeld, stray: true, sent: true, elsewhere: true},
		{name: "CONFIRMED", state: reservation.StatusConfirmed, sent: true},
		{name: "CONFIRMED stray", state: reservation.StatusConfirmed, stray: true, sent: true},
		{name: "CANCELLED", state: reservation.StatusCancelled, sent: true},
	}
	groupSetups = []groupSetup{
		{name: "open"},
		{name: "open past its deadline", late: true},
		{name: "formed", formed: true},
	}
	rowSetups = []rowSetup{
		{name: "CONFIRMED, version unknown", status: reservation.StatusConfirmed},
		{name: "CONFIRMED after the warm-up", status: reservation.StatusConfirmed, version: warmedAt + 4},
		{name: "CONFIRMED at the warm-up", status: reservation.StatusConfirmed, version: warmedAt},
		{name: "CONFIRMED before the warm-up", status: reservation.StatusConfirmed, version: warmedAt - 2},
		{name: "CANCELLED by the buyer", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Fenced, release: reservation.ReleaseOwed},
		{name: "CANCELLED, released", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Fenced, release: reservation.ReleaseDone},
		{name: "CANCELLED expired", status: reservation.StatusCancelled, reason: reservation.ReasonExpired, how: reservation.Fenced, release: reservation.ReleaseOwed},
		{name: "CANCELLED not joining", status: reservation.StatusCancelled, reason: reservation.ReasonGroupFull, how: reservation.Fenced, release: reservation.ReleaseOwed},
		{name: "refunded", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Refunded, release: reservation.ReleaseOwed},
		{name: "refunded after the warm-up", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Refunded, release: reservation.ReleaseOwed, refundAt: warmedAt + 4},
		{name: "refunded at the warm-up", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Refunded, release: reservation.ReleaseOwed, refundAt: warmedAt},
		{name: "refunded before the warm-up", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Refunded, release: reservation.ReleaseOwed, refundAt: warmedAt - 2},
		{name: "refunded, released", status: reservation.StatusCancelled, reason: reservation.ReasonBuyer, how: reservation.Refunded, release: reservation.ReleaseDone},
	}
)

// reactionCases is every combination: a buy's holds × rows × the stock
// figure there or lost; a join's holds × its group × rows.
func reactionCases() []reactionCase {
	var cs []reactionCase
	for _, h := range holdSetups {
		for _, r := range rowSetups {
			for _, lost := range []bool{false, true} {
				name := fmt.Sprintf("buy/%s/%s", h.name, r.name)
				if lost {
					name += "/stock lost"
				}
				cs = append(cs, reactionCase{name: name, hold: h, row: r, lost: lost})
			}
		}
	}
	for _, h := range joinSetups {
		for _, g := range groupSetups {
			for _, r := range rowSetups {
				for _, lost := range []bool{false, true} {
					name := fmt.Sprintf("join/%s/group %s/%s", h.name, g.name, r.name)
					if lost {
						name += "/stock lost"
					}
					cs = append(cs, reactionCase{name: name, hold: h, group: g, row: r, lost: lost})
				}
			}
		}
	}
	return cs
}

// Reactions holds a Holds to reservation.React: every combination of the
// hold Redis has (none, HELD, CONFIRMED, CANCELLED; of the row's token or a
// stray's, which may hold a slot of another group than the row's; a join
// sent or not, in a group open, past its deadline or formed; the stock
// figure there or lost) and MySQL's decided row
// (CONFIRMED with a version before or after the warm-up; CANCELLED for a
// reason that counts in a group or not; refunded, before or after the
// warm-up; released) is set up through the port, followed once, and the
// figures Redis shows after it (available, held, the buyer's units, the
// group's free slots and the stray's group's, the hold's state, Follow's
// answer) must be what React predicts. A second Follow of the same row must
// change nothing.
func Reactions(t *testing.T, newHolds HoldsFactory) {
	for _, tc := range reactionCases() {
		for _, batch := range []bool{false, true} {
			name := tc.name + "/Follow"
			if batch {
				name = tc.name + "/FollowAll"
			}
			t.Run(name, func(t *testing.T) { react(t, newHolds, tc, batch) })
		}
	}
}

// react runs one case, through Follow or (batch) FollowAll.
func react(t *testing.T, newHolds HoldsFactory, tc reactionCase, batch bool) {
	ctx := context.Background()
	c := &clock{now: t0}
	s := newHolds(t, c, 0, 0)
	sku := testservices.Name("sku")
	const user = "u"
	level := reservation.StockLevel{SKU: sku, Available: 20, Version: warmedAt}
	if res, err := s.Warm(ctx, level, nil, nil); err != nil || res != reservation.SyncWarmed {
		t.Fatalf("Warm = %v %v", res, err)
	}
	// Another hold of the buyer's keeps their units above what any
	// case gives back, so every change of them is seen.
	if _, _, err := s.Reserve(ctx, hold(sku, "background", user, 5), ttl); err != nil {
		t.Fatalf("background hold: %v", err)
	}

	join := tc.group.name != ""
	// groups are the row's group and the stray's other group ("": none).
	var groups [2]string
	if join {
		groups[0] = "g"
	}
	if tc.hold.elsewhere {
		groups[1] = "g2"
	}
	gid := groups[0]
	deadline := t0.Add(time.Hour)
	for _, g := range groups {
		if g == "" {
			continue
		}
		if err := s.CreateGroup(ctx, reservation.Group{ID: g, SKU: sku, Capacity: 3, Remaining: 3, Status: reservation.GroupOpen, Deadline: deadline}); err != nil {
			t.Fatalf("CreateGroup(%s): %v", g, err)
		}
	}
	id := reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: user, IdempotencyKey: "k"}, nil)
	r := hold(sku, id, user, 2)
	if join {
		r.GroupID = gid
	}
	facts := reservation.HoldFacts{State: tc.hold.state, Stocked: !tc.lost, WarmedFrom: warmedAt}
	if tc.hold.state != "" {
		h := r
		if tc.hold.stray {
			h.Token, h.Qty = "t-stray", 3
		}
		if tc.hold.elsewhere {
			h.GroupID = groups[1]
		}
		if _, out, err := s.Reserve(ctx, h, ttl); err != nil || out.Replayed {
			t.Fatalf("Reserve = %+v %v", out, err)
		}
		if tc.hold.sent {
			if _, err := s.AcceptJoin(ctx, h); err != nil {
				t.Fatalf("AcceptJoin: %v", err)
			}
		}
		switch tc.hold.state {
		case reservation.StatusConfirmed:
			if _, err := s.Follow(ctx, row(h, reservation.StatusConfirmed, false), 0); err != nil {
				t.Fatalf("Follow(CONFIRMED): %v", err)
			}
		case reservation.StatusCancelled:
			if _, err := s.Follow(ctx, row(h, reservation.StatusCancelled, false), 0); err != nil {
				t.Fatalf("Follow(CANCELLED): %v", err)
			}
			facts.Applied, facts.AppliedToken = true, h.Token
		}
		facts.Token, facts.Qty, facts.Group, facts.Sent = h.Token, h.Qty, h.GroupID, tc.hold.sent
		holding := tc.hold.state != reservation.StatusCancelled
		facts.Slot.Held = join && holding && !tc.hold.elsewhere
		facts.StraySlot.Held = tc.hold.elsewhere && holding
	}
	for _, g := range groups {
		if g == "" || !tc.group.formed {
			continue
		}
		if ok, err := s.FormGroup(ctx, reservation.Group{ID: g, SKU: sku}, t0); err != nil || !ok {
			t.Fatalf("FormGroup(%s) = %v %v", g, ok, err)
		}
	}
	if tc.group.late {
		c.now = deadline.Add(time.Second)
	}
	if join {
		facts.Slot.Open, facts.Slot.BeforeDeadline = !tc.group.formed, !tc.group.late
	}
	if tc.hold.elsewhere {
		facts.StraySlot.Open, facts.StraySlot.BeforeDeadline = !tc.group.formed, !tc.group.late
	}
	if tc.lost {
		if err := s.ForgetStock(ctx, sku); err != nil {
			t.Fatalf("ForgetStock: %v", err)
		}
	}

	decided := r
	decided.Status, decided.Reason, decided.Cancellation, decided.Release = tc.row.status, tc.row.reason, tc.row.how, tc.row.release
	decided.RefundVersion = tc.row.refundAt
	want := reservation.React(facts, decided, tc.row.version)

	before := observe(t, s, sku, user, groups, !tc.lost)
	got := followCode(t, s, decided, tc.row.version, batch)
	after := observe(t, s, sku, user, groups, !tc.lost)
	state := holdState(t, s, r.ID)
	if got != want.Code {
		t.Errorf("Follow answered %d, React says %d", got, want.Code)
	}
	if state != want.After {
		t.Errorf("hold afterwards %q, React says %q", state, want.After)
	}
	if !tc.lost {
		if d := after.available - before.available; d != want.Stock {
			t.Errorf("available moved by %d, React says %d", d, want.Stock)
		}
		if d := after.held - before.held; d != want.Held {
			t.Errorf("held moved by %d, React says %d", d, want.Held)
		}
	}
	if after.hasUsers {
		if d := after.users - before.users; d != want.Users {
			t.Errorf("the buyer's units moved by %d, React says %d", d, want.Users)
		}
	}
	for i, reopens := range []bool{want.SlotReopened, want.StraySlotReopened} {
		if groups[i] == "" {
			continue
		}
		if reopened := after.free[i] > before.free[i]; reopened != reopens || after.free[i]-before.free[i] > 1 {
			t.Errorf("free slots of %s %d → %d, React says reopened=%v", groups[i], before.free[i], after.free[i], reopens)
		}
	}

	// Once is once: the same row again changes nothing (unless it
	// could not follow yet).
	if want.Code == reservation.FollowPending {
		return
	}
	if again := followCode(t, s, decided, tc.row.version, batch); again != reservation.FollowNothing {
		t.Errorf("a second Follow answered %d, want %d", again, reservation.FollowNothing)
	}
	if twice := observe(t, s, sku, user, groups, !tc.lost); twice != after {
		t.Errorf("a second Follow moved the figures: %+v → %+v", after, twice)
	}

	// The stray's member entry went with its slot: the buyer may join its
	// group again (while it takes joins).
	if want.StraySlotReopened && !tc.group.late && !tc.lost {
		again := hold(sku, "again", user, 1)
		again.GroupID = groups[1]
		if _, _, err := s.Reserve(ctx, again, ttl); err != nil {
			t.Errorf("the buyer joins %s again after its stray left it: %v", groups[1], err)
		}
	}
}

// figures is what the suite reads of a bucket after each step.
type figures struct {
	available, held int64
	users           int64
	hasUsers        bool
	free            [2]int // the free slots of each group observed
}

// observe reads the figures: the stock (if stocked), the buyer's units, and
// the free slots of each of groups that is not "".
func observe(t *testing.T, s HoldsUnderTest, sku, user string, groups [2]string, stocked bool) figures {
	t.Helper()
	ctx := context.Background()
	var f figures
	if stocked {
		rs, err := s.Stock(ctx, sku)
		if err != nil {
			t.Fatalf("Stock: %v", err)
		}
		f.available, f.held = rs.Available, rs.Held
	}
	if u, ok := s.(UserUnits); ok {
		n, err := u.UserUnits(ctx, sku, user)
		if err != nil {
			t.Fatalf("UserUnits: %v", err)
		}
		f.users, f.hasUsers = n, true
	}
	for i, gid := range groups {
		if gid == "" {
			continue
		}
		g, err := s.Group(ctx, sku, gid)
		if err != nil {
			t.Fatalf("Group(%s): %v", gid, err)
		}
		f.free[i] = g.Remaining
	}
	return f
}

func followCode(t *testing.T, s HoldsUnderTest, row reservation.Reservation, version int64, batch bool) reservation.FollowCode {
	t.Helper()
	var returned bool
	var err error
	if batch {
		rs, errs := s.FollowAll(context.Background(), []reservation.Reservation{row}, version)
		if len(rs) != 1 || len(errs) != 1 {
			t.Fatalf("FollowAll of one row answered %d/%d", len(rs), len(errs))
		}
		returned, err = rs[0], errs[0]
	} else {
		returned, err = s.Follow(context.Background(), row, version)
	}
	switch {
	case errors.Is(err, reservation.ErrUnknownSKU):
		return reservation.FollowPending
	case err != nil:
		t.Fatalf("Follow: %v", err)
	case returned:
		return reservation.FollowReturned
	}
	return reservation.FollowNothing
}

func holdState(t *testing.T, s HoldsUnderTest, id string) reservation.Status {
	t.Helper()
	h, err := s.Hold(context.Background(), id, 0)
	if errors.Is(err, reservation.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("Hold: %v", err)
	}
	return h.Status
}
