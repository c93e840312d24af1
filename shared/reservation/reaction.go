package reservation

// The hold's reaction to MySQL's decision.
//
// Once MySQL has decided a reservation, its hold in Redis follows the row
// (Holds.Follow). What the hold does depends only on what Redis has for the
// id and on the row. React is that rule, as a pure function. follow.lua
// carries it out atomically in Redis, the fake carries it out in memory, and
// the contract suite (reservationtest.Reactions) holds both to React over
// every combination of hold and row.

// HoldFacts is what Redis has for a reservation id when MySQL's row reaches
// it. A hold of the id is the same buyer's (the id names its buyer), so its
// units are counted under the row's user.
type HoldFacts struct {
	// State is the hold's state; "" when Redis has no hold for the id.
	State Status
	// Token names the hold's incarnation (Reservation.Token).
	Token string
	// Qty is the hold's units.
	Qty int
	// Group is the hold's group ("" for a buy).
	Group string
	// Sent is a join's accepted mark (Holds.AcceptJoin).
	Sent bool
	// Applied says the hold already carried out a cancellation, for the
	// token AppliedToken (follow.lua's rel field).
	Applied      bool
	AppliedToken string
	// Stocked says Redis has the bucket's stock figure.
	Stocked bool
	// WarmedFrom is the MySQL version the stock was last warmed from
	// (meta.wver).
	WarmedFrom int64
	// Slot describes the slot the id holds in the row's group, if any.
	Slot SlotFacts
	// StraySlot describes the slot a stray holds in its own group when
	// that is another than the row's (Group differs from the row's
	// GroupID): a keyed join retried into another group after Redis forgot
	// the first.
	StraySlot SlotFacts
}

// SlotFacts is what Redis has of the group's slot a join holds.
type SlotFacts struct {
	Held           bool // the group's member entry of the buyer names this id
	Open           bool // the group is OPEN
	BeforeDeadline bool // Redis's now is before the group's deadline
}

// FollowCode is what Holds.Follow's script answers (follow.lua's reply).
type FollowCode int

// The answers of follow.lua.
const (
	FollowNothing  FollowCode = 0 // no stock came back
	FollowReturned FollowCode = 1 // stock came back to the bucket
	FollowPending  FollowCode = 2 // a refund needs the stock figure: warm it, then follow again
)

// Reaction is what a hold does when MySQL's row reaches it: the changes of
// the bucket's figures, and the hold's state afterwards.
type Reaction struct {
	Code FollowCode
	// Stray: a hold of another token was dropped (Redis had taken the id
	// again after forgetting the hold MySQL decided).
	Stray bool
	// Stock is the change of the units buyers can reserve (0 when the
	// bucket has no stock figure).
	Stock int64
	// Held is the change of the units HELD.
	Held int64
	// Users is the change of the buyer's per-user units. Redis keeps no
	// figure below zero: a buyer whose units Redis lost ends at zero.
	Users int64
	// SlotReopened: the join's slot in the row's group is free again.
	SlotReopened bool
	// StraySlotReopened: the stray's slot in its own group, another than
	// the row's, is free again.
	StraySlotReopened bool
	// After is the hold's state afterwards ("" when Redis has none).
	After Status
}

// React returns how a hold with the facts h reacts to MySQL's decided row.
// version is the stock row's version after a CONFIRMED commit (0: unknown).
//
// The rules, in order:
//  1. A hold of another token is a stray: a HELD one gives its units back,
//     and its slot in its own group if that is another than the row's and
//     still OPEN (MySQL never took the stray: deadline or not, as a join
//     that never counted); it is dropped either way.
//  2. A refund that must give units back while Redis has no stock figure
//     waits (FollowPending): nothing more changes.
//  3. Without a hold, the row's tombstone is written, so a replay takes
//     nothing.
//  4. CONFIRMED: a HELD hold becomes CONFIRMED and its units leave held. A
//     lost hold whose commit is newer than the level the stock was warmed
//     from has its units taken now (Redis never took them).
//  5. CANCELLED, already carried out for this token: nothing moves.
//  6. CANCELLED: a HELD hold gives its units back. A refund (a CONFIRMED or
//     lost hold, its release not yet acknowledged) gives the row's units
//     back, unless the stock was warmed from a level that counts them.
//
// A give-back also returns the buyer's per-user units, and the join's slot
// while its group is OPEN: before the deadline, or at any time for a join
// that never counted (CountsInGroup, or a hold that expired unsent).
func React(h HoldFacts, row Reservation, version int64) Reaction {
	var out Reaction
	neverCounted := row.Status == StatusCancelled && !row.Reason.CountsInGroup() ||
		row.Reason == ReasonExpired && h.State == StatusHeld && !h.Sent
	slotHeld := h.Slot.Held
	giveBack := func(n int64, group string, counted bool) {
		if h.Stocked && !counted {
			out.Stock += n
		}
		if row.UserID != "" {
			out.Users -= n
		}
		if group != "" && group == row.GroupID && slotHeld && h.Slot.Open && (neverCounted || h.Slot.BeforeDeadline) {
			out.SlotReopened, slotHeld = true, false
		}
	}

	state := h.State
	if state != "" && row.Token != "" && h.Token != row.Token { // 1
		if state == StatusHeld {
			out.Held -= int64(h.Qty)
			giveBack(int64(h.Qty), h.Group, false)
			if h.Group != "" && h.Group != row.GroupID && h.StraySlot.Held && h.StraySlot.Open {
				out.StraySlotReopened = true
			}
			out.Code = FollowReturned
		}
		out.Stray, state = true, ""
	}
	refund := row.Cancellation == Refunded && row.Release == ReleaseOwed &&
		(state == StatusConfirmed || state == "") && (state == "" || !h.applied(row))
	if refund && !h.Stocked { // 2
		out.Code, out.After = FollowPending, state
		return out
	}
	out.After = state
	if state == "" { // 3
		out.After = row.Status
	}

	qty := int64(row.Qty)
	if row.Status == StatusConfirmed { // 4
		if state == "" && version > 0 && h.Stocked && version > h.WarmedFrom {
			out.Stock -= qty
			if row.UserID != "" {
				out.Users += qty
			}
		}
		if state == StatusHeld {
			out.Held -= int64(h.Qty)
			out.After = StatusConfirmed
		}
		return out
	}

	if state != "" && h.applied(row) { // 5
		return out
	}
	switch { // 6
	case state == StatusHeld:
		out.Held -= int64(h.Qty)
		giveBack(int64(h.Qty), h.Group, false)
		out.Code = FollowReturned
	case refund:
		counted := row.RefundVersion > 0 && h.WarmedFrom >= row.RefundVersion
		giveBack(qty, row.GroupID, counted)
		if !counted {
			out.Code = FollowReturned
		}
	}
	out.After = StatusCancelled
	return out
}

// applied reports whether the hold carried out row's cancellation already.
func (h HoldFacts) applied(row Reservation) bool { return h.Applied && h.AppliedToken == row.Token }
