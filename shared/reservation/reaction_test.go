package reservation

import "testing"

// React's rules, one row each, with the reaction written out. The contract
// suite (reservationtest.Reactions) then holds follow.lua and the fake to
// React over every combination; this table holds React to the rules.
func TestReact(t *testing.T) {
	const tok, other = "t1", "t2"
	buy := Reservation{ID: "r", SKU: "s", Qty: 2, UserID: "u", Token: tok}
	join := buy
	join.GroupID = "g"
	confirmed := func(r Reservation) Reservation { r.Status = StatusConfirmed; return r }
	cancelled := func(r Reservation, why Reason) Reservation {
		r.Status, r.Reason, r.Cancellation, r.Release = StatusCancelled, why, Fenced, ReleaseOwed
		return r
	}
	refunded := func(r Reservation, at int64) Reservation {
		r = cancelled(r, ReasonBuyer)
		r.Cancellation, r.RefundVersion = Refunded, at
		return r
	}
	released := func(r Reservation) Reservation { r.Release = ReleaseDone; return r }

	stocked := HoldFacts{Stocked: true, WarmedFrom: 5}
	held := HoldFacts{State: StatusHeld, Token: tok, Qty: 2, Stocked: true, WarmedFrom: 5}
	heldJoin := held
	heldJoin.Group, heldJoin.Sent, heldJoin.Slot = "g", true, SlotFacts{Held: true, Open: true, BeforeDeadline: true}
	late := heldJoin
	late.Slot.BeforeDeadline = false
	lateUnsent := late
	lateUnsent.Sent = false
	formed := heldJoin
	formed.Slot.Open = false
	stray := held
	stray.Token, stray.Qty = other, 3
	// A stray held in another group (g2) than the row's: its slot there.
	strayElsewhere := stray
	strayElsewhere.Group, strayElsewhere.Sent = "g2", true
	strayElsewhere.StraySlot = SlotFacts{Held: true, Open: true, BeforeDeadline: true}
	strayElsewhereLate := strayElsewhere
	strayElsewhereLate.StraySlot.BeforeDeadline = false
	strayElsewhereFormed := strayElsewhere
	strayElsewhereFormed.StraySlot.Open = false
	strayElsewhereNotMember := strayElsewhere
	strayElsewhereNotMember.StraySlot.Held = false
	done := HoldFacts{State: StatusConfirmed, Token: tok, Qty: 2, Stocked: true, WarmedFrom: 5}
	gone := HoldFacts{State: StatusCancelled, Token: tok, Qty: 2, Applied: true, AppliedToken: tok, Stocked: true, WarmedFrom: 5}
	lostStock := done
	lostStock.Stocked = false

	for _, tc := range []struct {
		name    string
		hold    HoldFacts
		row     Reservation
		version int64
		want    Reaction
	}{
		{"a HELD hold is confirmed: its units leave held, stock stays taken",
			held, confirmed(buy), 9, Reaction{Held: -2, After: StatusConfirmed}},
		{"a CONFIRMED hold confirmed again: nothing",
			done, confirmed(buy), 9, Reaction{After: StatusConfirmed}},
		{"a lost hold whose commit is newer than the warm-up: its units are taken now",
			stocked, confirmed(buy), 9, Reaction{Stock: -2, Users: 2, After: StatusConfirmed}},
		{"a lost hold whose commit the warm-up counted: a tombstone only",
			stocked, confirmed(buy), 5, Reaction{After: StatusConfirmed}},
		{"a lost hold, version unknown: a tombstone only (reconciliation repairs it)",
			stocked, confirmed(buy), 0, Reaction{After: StatusConfirmed}},
		{"a HELD hold is cancelled: stock and the buyer's units come back",
			held, cancelled(buy, ReasonExpired), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, After: StatusCancelled}},
		{"a cancellation carried out already: nothing, however often",
			gone, cancelled(buy, ReasonBuyer), 0, Reaction{After: StatusCancelled}},
		{"a fence of a hold Redis never had: a tombstone, nothing moves",
			stocked, cancelled(buy, ReasonHoldFailed), 0, Reaction{After: StatusCancelled}},
		{"a refund of a CONFIRMED hold: stock and the buyer's units come back",
			done, refunded(buy, 9), 0, Reaction{Code: FollowReturned, Stock: 2, Users: -2, After: StatusCancelled}},
		{"a refund the warm-up counted: the buyer's units only",
			done, refunded(buy, 5), 0, Reaction{Users: -2, After: StatusCancelled}},
		{"a refund already acknowledged (released): nothing moves",
			done, released(refunded(buy, 9)), 0, Reaction{After: StatusCancelled}},
		{"a refund while Redis has no stock figure: it waits, nothing changes",
			lostStock, refunded(buy, 9), 0, Reaction{Code: FollowPending, After: StatusConfirmed}},
		{"a HELD stray is returned and replaced by the row's tombstone",
			stray, confirmed(buy), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, After: StatusConfirmed}},
		{"a HELD stray meeting a fence: returned; the row's hold was never taken",
			stray, cancelled(buy, ReasonBuyer), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, After: StatusCancelled}},
		{"a HELD stray of another group: returned, and its slot there reopens",
			strayElsewhere, confirmed(join), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, StraySlotReopened: true, After: StatusConfirmed}},
		{"a HELD stray of another group meeting a buy's row: its slot there reopens",
			strayElsewhere, cancelled(buy, ReasonBuyer), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, StraySlotReopened: true, After: StatusCancelled}},
		{"a HELD stray of another group past that group's deadline: MySQL never took it, its slot reopens",
			strayElsewhereLate, confirmed(join), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, StraySlotReopened: true, After: StatusConfirmed}},
		{"a HELD stray of another group that formed: units back, that group keeps its slot",
			strayElsewhereFormed, confirmed(join), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, After: StatusConfirmed}},
		{"a HELD stray of another group whose member entry names another id: no slot is freed",
			strayElsewhereNotMember, confirmed(join), 0, Reaction{Code: FollowReturned, Stray: true, Stock: 3, Held: -3, Users: -3, After: StatusConfirmed}},
		{"a join cancelled before the deadline: its slot reopens",
			heldJoin, cancelled(join, ReasonBuyer), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, SlotReopened: true, After: StatusCancelled}},
		{"a counted join cancelled after the deadline: its slot stays taken",
			late, cancelled(join, ReasonBuyer), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, After: StatusCancelled}},
		{"a join MySQL refused as not joining: its slot reopens after the deadline",
			late, cancelled(join, ReasonGroupFull), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, SlotReopened: true, After: StatusCancelled}},
		{"a join that expired unsent never counted: its slot reopens after the deadline",
			lateUnsent, cancelled(join, ReasonExpired), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, SlotReopened: true, After: StatusCancelled}},
		{"a join that expired sent counted: its slot stays taken after the deadline",
			late, cancelled(join, ReasonExpired), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, After: StatusCancelled}},
		{"a member of a formed group leaves: units back, the group keeps its slot",
			formed, cancelled(join, ReasonBuyer), 0, Reaction{Code: FollowReturned, Stock: 2, Held: -2, Users: -2, After: StatusCancelled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := React(tc.hold, tc.row, tc.version); got != tc.want {
				t.Errorf("React =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}
