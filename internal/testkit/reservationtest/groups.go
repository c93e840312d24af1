package reservationtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// testGroups is the Holds suite's Groups part: CreateGroup, joins through
// Reserve, Group, AcceptJoin, GroupHoldersAccepted, FormGroup, CloseGroup(s).
func testGroups(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	t.Run("groups: slots, one join per user, FORMED is final, close", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
		g := reservation.Group{ID: "g1", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		join := func(id, user string) (reservation.Reservation, reservation.ReserveOutcome, error) {
			r := hold(sku, id, user, 1)
			r.GroupID = "g1"
			return s.Reserve(ctx, r, ttl)
		}
		a, out, err := join("a", "u1")
		if err != nil || out.Full {
			t.Fatalf("first join = %v %+v", err, out)
		}
		if _, _, err := join("b", "u1"); !errors.Is(err, reservation.ErrAlreadyJoined) {
			t.Errorf("same user twice = %v, want ErrAlreadyJoined", err)
		}
		if _, out, err := join("c", "u2"); err != nil || !out.Full {
			t.Fatalf("last slot = %v %+v, want full", err, out)
		}
		if _, _, err := join("d", "u3"); !errors.Is(err, reservation.ErrGroupFull) {
			t.Errorf("third join = %v, want ErrGroupFull", err)
		}
		if gr, err := s.Group(ctx, sku, "g1"); err != nil || gr.Remaining != 0 || gr.Status != reservation.GroupOpen {
			t.Errorf("Group = %+v %v, want OPEN with 0 remaining until MySQL records it FORMED", gr, err)
		}
		c.now = t0.Add(2 * time.Hour)
		if cl, err := s.CloseGroup(ctx, g); err != nil || !cl.Full || !cl.FullAt.Equal(t0) {
			t.Errorf("CloseGroup of a full group = %+v %v, want full (MySQL decides)", cl, err)
		}
		c.now = t0
		if ok, err := s.FormGroup(ctx, g, t0); err != nil || !ok {
			t.Fatalf("FormGroup = %v %v", ok, err)
		}
		if gr, err := s.Group(ctx, sku, "g1"); err != nil || gr.Remaining != 0 || gr.Status != reservation.GroupFormed || !gr.FormedAt.Equal(t0) {
			t.Errorf("Group = %+v %v, want FORMED at t0 with 0 remaining", gr, err)
		}
		// Releasing a member of a FORMED group does not reopen it.
		if !follow(t, s, row(a, reservation.StatusCancelled, false)) {
			t.Fatal("the member's stock did not come back")
		}
		if gr, _ := s.Group(ctx, sku, "g1"); gr.Remaining != 0 || gr.Status != reservation.GroupFormed {
			t.Errorf("after release = %+v, want still FORMED", gr)
		}
		c.now = t0.Add(2 * time.Hour)
		if cl, err := s.CloseGroup(ctx, g); err != nil || cl.Status != reservation.GroupFormed {
			t.Errorf("CloseGroup of a formed group = %+v %v, want FORMED", cl, err)
		}
	})

	t.Run("groups: a slot counts once its join is accepted (AcceptJoin), or decided", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 10, 0)
		g := reservation.Group{ID: "g3", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		var held []reservation.Reservation
		for _, u := range []string{"u1", "u2"} {
			r := hold(sku, "j"+u, u, 1)
			r.GroupID = "g3"
			h, _, err := s.Reserve(ctx, r, ttl)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, h)
		}
		if ok, err := s.GroupHoldersAccepted(ctx, g); err != nil || ok {
			t.Errorf("GroupHoldersAccepted with two joins in flight = %v %v, want false", ok, err)
		}
		if full, err := s.AcceptJoin(ctx, held[0]); err != nil || !full {
			t.Errorf("AcceptJoin of the first = %v %v, want full (no free slot)", full, err)
		}
		if ok, _ := s.GroupHoldersAccepted(ctx, g); ok {
			t.Error("GroupHoldersAccepted with one join in flight = true, want false")
		}
		stale := held[1]
		stale.Token = "another"
		if _, err := s.AcceptJoin(ctx, stale); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("AcceptJoin of another token = %v, want ErrNotFound (not accepted)", err)
		}
		if ok, _ := s.GroupHoldersAccepted(ctx, g); ok {
			t.Error("AcceptJoin of another token marked the hold: GroupHoldersAccepted = true, want false")
		}
		if _, err := s.AcceptJoin(ctx, held[1]); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.GroupHoldersAccepted(ctx, g); err != nil || !ok {
			t.Errorf("GroupHoldersAccepted with both joins accepted = %v %v, want true", ok, err)
		}
	})

	t.Run("groups: an unfilled group closes only after its deadline, and releases reopen slots while OPEN", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
		g := reservation.Group{ID: "g2", SKU: sku, Capacity: 3, Remaining: 3, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		join := func(id, user string) (reservation.Reservation, error) {
			r := hold(sku, id, user, 1)
			r.GroupID = "g2"
			h, _, err := s.Reserve(ctx, r, ttl)
			return h, err
		}
		a, err := join("a", "u1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := join("b", "u2"); err != nil {
			t.Fatal(err)
		}
		follow(t, s, row(a, reservation.StatusCancelled, false))
		if gr, _ := s.Group(ctx, sku, "g2"); gr.Remaining != 2 || gr.Status != reservation.GroupOpen {
			t.Errorf("after release = %+v, want OPEN with 2 remaining", gr)
		}
		if cl, err := s.CloseGroup(ctx, g); err != nil || !cl.NotDue {
			t.Errorf("CloseGroup before the deadline = %+v %v, want not due", cl, err)
		}
		c.now = t0.Add(time.Hour)
		cl, err := s.CloseGroup(ctx, g)
		if err != nil || cl.Status != reservation.GroupFailed || len(cl.Holders) != 1 || cl.Holders[0] != "b" {
			t.Errorf("CloseGroup = %+v %v, want FAILED held by [b]", cl, err)
		}
		c.now = t0
		if _, err := join("e", "u4"); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join closed group = %v, want ErrGroupClosed", err)
		}
		other := hold(sku, "x", "u9", 1)
		other.GroupID = "nosuch"
		if _, _, err := s.Reserve(ctx, other, ttl); !errors.Is(err, reservation.ErrUnknownGroup) {
			t.Errorf("unknown group = %v, want ErrUnknownGroup", err)
		}
		if cl, err := s.CloseGroup(ctx, reservation.Group{ID: "nosuch", SKU: sku}); err != nil || !cl.Unknown {
			t.Errorf("CloseGroup(unknown) = %+v %v", cl, err)
		}
		// CloseGroups answers as CloseGroup does, group by group.
		c.now = t0.Add(time.Hour)
		many, errs := s.CloseGroups(ctx, []reservation.Group{g, {ID: "nosuch", SKU: sku}})
		if len(many) != 2 || errs[0] != nil || errs[1] != nil || many[0].Status != reservation.GroupFailed ||
			len(many[0].Holders) != 1 || many[0].Holders[0] != "b" || !many[1].Unknown {
			t.Errorf("CloseGroups(g2, unknown) = %+v %v, want FAILED held by [b], then unknown", many, errs)
		}
		c.now = t0
	})

	t.Run("a join past the deadline is refused by the script's clock", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
		g := reservation.Group{ID: "g3", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Minute)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		c.now = t0.Add(time.Minute)
		late := hold(sku, "y", "u8", 1)
		late.GroupID = "g3"
		if _, _, err := s.Reserve(ctx, late, ttl); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join at the deadline = %v, want ErrGroupClosed", err)
		}
	})
}
