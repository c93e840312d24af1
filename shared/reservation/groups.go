package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// CreateGroup opens a group-buy of capacity slots on sku for user (its
// creator). ttl 0 means the default deadline, counted from Redis's clock (the
// one reserve.lua judges joins by). Opening a group is an attempt of the
// creator's: it costs a token of their attempt budget on the SKU (the one
// buys and joins draw on; *RateLimitedError past it) and one of their
// Config.MaxOpenGroups places (*TooManyGroupsError when they have none), both
// taken in Redis before MySQL is written, so a refused create costs MySQL
// nothing; an unknown SKU is answered from Redis or the unknown-SKU memory
// when it can.
func (s *Service) CreateGroup(ctx context.Context, user, sku string, capacity int, ttl time.Duration) (Group, error) {
	switch {
	case !ValidID(sku):
		return Group{}, invalid("sku", "must be 1-64 characters of letters, digits and ._:-")
	case capacity < 2 || capacity > 1000:
		return Group{}, invalid("capacity", "must be between 2 and 1000")
	case ttl < 0 || ttl > s.cfg.MaxGroupTTL:
		return Group{}, invalid("ttl_seconds", "must be between 1 and %d", int(s.cfg.MaxGroupTTL.Seconds()))
	case !ValidID(user):
		return Group{}, invalid("user_id", "must be 1-64 characters of letters, digits and ._:-")
	}
	if ttl == 0 {
		ttl = s.cfg.GroupTTL
	}
	l, err := s.layoutOf(ctx, sku)
	if err != nil {
		return Group{}, err
	}
	now, err := s.slots.Now(ctx)
	if err != nil {
		return Group{}, err
	}
	g := Group{
		ID: "g-" + strings.TrimPrefix(ReservationID(ReserveRequest{}, nil), "."), SKU: sku, Capacity: capacity, Remaining: capacity,
		Status: GroupOpen, Deadline: now.Add(ttl).Truncate(time.Millisecond), CreatedAt: now,
	}
	a := Attempt{SKU: sku, Bucket: HomeBucket(user, "", l.k), UserID: user, Token: g.ID,
		Group: g.ID, Until: g.Deadline.Add(s.groupCountsAfter()), MaxOpen: s.cfg.MaxOpenGroups}
	if err := s.holds.Charge(ctx, a); err != nil {
		switch {
		case errors.Is(err, ErrRateLimited):
			s.metrics.Count("rate_limited", 1)
		case errors.Is(err, ErrTooManyGroups):
			s.metrics.Count("too_many_groups", 1)
		}
		return Group{}, err
	}
	if err := s.ledger.CreateGroup(ctx, g); err != nil {
		return Group{}, err
	}
	if err := s.slots.CreateGroup(ctx, g); err != nil {
		// MySQL has an OPEN group nobody can join; the sweeper fails it at
		// its deadline with no members.
		return Group{}, err
	}
	s.layouts.drop(sku) // the SKU has groups now: keyed buys check bucket 0 (crossBucketMismatch)
	return g, nil
}

// groupCountsAfter is how long after its deadline a group still counts as
// one of its creator's open groups: until the sweeper (every minute) has
// ended it, so that a buyer's short-lived groups cannot outpace the sweeps
// that end them.
func (s *Service) groupCountsAfter() time.Duration { return time.Minute + s.cfg.SweepGrace }

// Group returns one coherent view of a group. FORMED is final and FAILED
// terminal (no slot left to take); while MySQL has it OPEN, Redis — where
// slots are taken — says whether its last slot is gone (FORMED) and how many
// are free. Members are the confirmed ones (MySQL).
func (s *Service) Group(ctx context.Context, id string) (Group, error) {
	if !ValidID(id) {
		return Group{}, ErrUnknownGroup
	}
	g, err := s.groupRow(ctx, id) // a made-up id is answered from memory when it can
	if err != nil {
		return Group{}, err
	}
	g.Remaining = 0
	if g.Status != GroupOpen {
		return g, nil
	}
	rg, err := s.slots.Group(ctx, g.SKU, id)
	switch {
	case err != nil:
		g.Remaining = g.Capacity - g.Members // Redis unreachable or lost it: MySQL's view
	case rg.Status == GroupFormed, rg.Status == GroupFailed:
		g.Status, g.FormedAt = rg.Status, rg.FormedAt
	case rg.Remaining <= 0:
		g.Status = GroupFull // every slot taken, not recorded FORMED yet
	default:
		g.Remaining = rg.Remaining
	}
	return g, nil
}

// groupWorkers is how many groups a sweep ends at once.
const groupWorkers = 16

// endGroups ends every group due by cutoff, page after page in deadline
// order, until none is left or the sweep nears its deadline; then it brings
// the ends that have not reached both stores there (a FORMED group Redis was
// not told of, a FAILED one not settled). A page costs one Redis round trip
// and, for its empty groups, one statement; a group with members a few
// round trips, groupWorkers at a time. So one buyer's many empty groups
// delay an honest group by a fraction of a second, never by a sweep each.
func (s *Service) endGroups(ctx context.Context, cutoff time.Time, rep *SweepReport) {
	var mu sync.Mutex
	tally := func(failed bool, g Group, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: end group", "group_id", g.ID, "error", err)
			return
		}
		if failed {
			rep.GroupsFailed++
		}
	}
	run := func(groups []Group, end func(Group) (bool, error)) {
		work := make(chan Group)
		var wg sync.WaitGroup
		for range min(groupWorkers, len(groups)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := range work {
					failed, err := end(g)
					tally(failed, g, err)
				}
			}()
		}
		for _, g := range groups {
			work <- g
		}
		close(work)
		wg.Wait()
	}
	var after Group
	for !nearDeadline(ctx) {
		groups, err := s.ledger.DueGroups(ctx, cutoff, after, s.cfg.SweepBatch)
		if err != nil {
			tally(false, Group{}, fmt.Errorf("list due groups: %w", err))
			break
		}
		if len(groups) == 0 {
			break
		}
		after = groups[len(groups)-1]
		// Redis closes the page in one round trip; the groups nobody holds
		// a slot of and MySQL has no member of end in one statement; the
		// others one by one (their members are cancelled).
		closings, errs := s.slots.CloseGroups(ctx, groups)
		var empty []string
		var rest []Group
		restClosing := map[string]GroupClosing{}
		for i, g := range groups {
			switch c := closings[i]; {
			case errs[i] != nil:
				tally(false, g, errs[i])
			case c.Status == GroupFailed && len(c.Holders) == 0 && g.Members == 0:
				empty = append(empty, g.ID)
			default:
				rest = append(rest, g)
				restClosing[g.ID] = c
			}
		}
		if len(empty) > 0 {
			n, err := s.ledger.FailEmptyGroups(ctx, empty, s.clock.Now())
			if err != nil {
				tally(false, Group{}, fmt.Errorf("fail empty groups: %w", err))
			}
			if n > 0 {
				s.publish(ctx, empty...) // their GroupFailed events
			}
			mu.Lock()
			rep.GroupsFailed += n
			mu.Unlock()
		}
		run(rest, func(g Group) (bool, error) { return s.endGroup(ctx, g, restClosing[g.ID]) })
	}
	if nearDeadline(ctx) {
		return
	}
	groups, err := s.ledger.UnsettledGroups(ctx, s.cfg.SweepBatch)
	if err != nil {
		tally(false, Group{}, fmt.Errorf("list unsettled groups: %w", err))
		return
	}
	run(groups, func(g Group) (bool, error) {
		if g.Status == GroupFormed {
			return false, s.formedReachesRedis(ctx, g)
		}
		return s.failGroup(ctx, g)
	})
}

// failGroup ends a group past its deadline. Redis decides whether it
// formed — slots are taken there, and a group whose last slot went before the
// deadline is FORMED for good, however late its members' messages reach
// MySQL — and MySQL records it. A group that did not form is FAILED in
// MySQL (the arbiter; a group whose members all persisted first stays
// FORMED), then every member from both stores is cancelled with its stock
// returned. It reports whether the group is FAILED.
func (s *Service) failGroup(ctx context.Context, g Group) (bool, error) {
	c, err := s.slots.CloseGroup(ctx, g)
	if err != nil {
		return g.Status == GroupFailed, err
	}
	return s.endGroup(ctx, g, c)
}

// endGroup is failGroup once Redis has closed the group (c).
func (s *Service) endGroup(ctx context.Context, g Group, c GroupClosing) (bool, error) {
	settling := g.Status == GroupFailed // a FAILED group being settled again
	var err error
	orDeadline := func(t time.Time) time.Time {
		if t.IsZero() {
			return g.Deadline
		}
		return t
	}
	switch {
	case settling:
	case c.NotDue:
		return false, nil // Redis's clock is behind the sweeper's: next sweep
	case c.Status == GroupFormed:
		formed, err := s.ledger.FormGroup(ctx, g.ID, orDeadline(c.FormedAt), s.clock.Now())
		if err == nil && formed {
			s.publish(ctx, g.ID)
			err = s.ledger.GroupSettled(ctx, g.ID) // Redis has it FORMED already
		}
		return false, err
	case c.Full:
		// Every slot was taken before the deadline: it formed, unless a
		// member's cancellation is still on its way to Redis — then the
		// next sweep, after the outbox drained, finds a free slot.
		return false, s.recordFormed(ctx, g, orDeadline(c.FullAt))
	case c.Unknown:
		// Redis lost the group: MySQL decides with what it knows.
		s.log.WarnContext(ctx, "group unknown to redis at its deadline; mysql decides", "group_id", g.ID)
	}
	holders := c.Holders
	g, err = s.ledger.FailGroup(ctx, g.ID, s.clock.Now())
	if err != nil {
		return false, err
	}
	if g.Status != GroupFailed {
		return false, nil
	}
	s.publish(ctx, g.ID) // its GroupFailed, before its members' cancellations
	rows, err := s.ledger.GroupMembers(ctx, g.ID)
	if err != nil {
		return true, err
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.ID] = true
		if _, _, err := s.refund(ctx, r.ID, ReasonGroupFailed, ""); err != nil {
			return true, err
		}
	}
	for _, id := range holders {
		if seen[id] {
			continue
		}
		if err := s.cancelMember(ctx, g.ID, id); err != nil {
			return true, err
		}
	}
	if err := s.ledger.GroupSettled(ctx, g.ID); err != nil {
		return true, err
	}
	s.log.InfoContext(ctx, "group failed", "group_id", g.ID, "sku", g.SKU, "members", len(rows), "holds", len(holders))
	return true, nil
}

// cancelMember cancels a member of the failed group gid known to Redis.
// Only what is gid's: a hold of another group is left as it is, and so is
// a row of another group that the fence finds (a stray held in gid under
// the id of another group's member; settle has returned the stray).
func (s *Service) cancelMember(ctx context.Context, gid, id string) error {
	h, err := s.holds.Hold(ctx, id, 0) // a join is held in bucket 0
	if errors.Is(err, ErrNotFound) {
		return nil // nothing held in Redis; MySQL has no row either
	}
	if err != nil {
		return err
	}
	if h.GroupID != gid {
		return nil // a stale member entry: the id is held for another group
	}
	row, err := s.fence(ctx, h, ReasonGroupFailed)
	if err != nil {
		return err
	}
	if row.Status == StatusConfirmed && row.GroupID == gid {
		_, _, err = s.refund(ctx, id, ReasonGroupFailed, "")
	}
	return err
}

// formGroup records a full group FORMED in MySQL, then in Redis. full says
// the caller knows every slot is taken (at: when the last one was);
// otherwise Redis is asked. Every step that learns a group's last slot went
// to an accepted join calls it: reserve after the last join's send, persist
// after it settles a join (the reserve that sent it may have died), a
// member's cancel before it is decided (a group filled in time stays formed
// whatever its members do afterwards), and the sweeper at the deadline.
func (s *Service) formGroup(ctx context.Context, g Group, at time.Time, full bool) {
	if !full {
		rg, err := s.slots.Group(ctx, g.SKU, g.ID)
		if err != nil || rg.Status != GroupOpen || rg.Remaining > 0 {
			return
		}
		if !rg.FullAt.IsZero() {
			at = rg.FullAt
		}
	}
	if at.IsZero() {
		at = s.clock.Now()
	}
	if err := s.recordFormed(ctx, g, at); err != nil {
		s.log.WarnContext(ctx, "group formation not recorded yet; the next step that meets the group, or the sweeper, records it",
			"group_id", g.ID, "error", err)
	}
}

// formBeforeLeaving is a member's cancel meeting its group: if every slot is
// taken, the group filled in time with this member in it, so it forms first
// and the member then leaves a FORMED group (no slot reopens).
func (s *Service) formBeforeLeaving(ctx context.Context, r Reservation) {
	if r.GroupID != "" {
		s.formGroup(ctx, Group{ID: r.GroupID, SKU: r.SKU}, time.Time{}, false)
	}
}

// recordFormed records a full group FORMED: MySQL decides (it refuses while
// a member's cancellation is still on its way to Redis), then Redis follows.
// The cancellations MySQL has not seen Redis follow are followed first: one
// Redis already applied (its acknowledgement was lost, or it never held a
// slot) must not block the record, and one Redis had not applied reopens its
// slot now, so the group is asked again whether it is full.
func (s *Service) recordFormed(ctx context.Context, g Group, at time.Time) error {
	if h := s.hooks.RecordFormed; h != nil {
		if err := h(g); err != nil {
			return err
		}
	}
	// Every slot must be held by an accepted join: one whose send is in
	// flight may still fail and give its slot back, so the group has not
	// filled yet. Its own reserve (once sent), persist, or the next sweep
	// asks again.
	if accepted, err := s.slots.GroupHoldersAccepted(ctx, g); err != nil || !accepted {
		return err
	}
	leaving, err := s.ledger.GroupLeaving(ctx, g.ID)
	if err != nil {
		return err
	}
	if len(leaving) > 0 {
		for _, row := range leaving {
			if err := s.carryOutNow(ctx, row, 0); err != nil {
				return err
			}
		}
		rg, err := s.slots.Group(ctx, g.SKU, g.ID)
		if err != nil && !errors.Is(err, ErrUnknownGroup) {
			return err
		}
		if err == nil && rg.Status == GroupOpen && rg.Remaining > 0 {
			return nil // a slot reopened: the group is not full after all
		}
	}
	formed, err := s.ledger.FormGroup(ctx, g.ID, at, s.clock.Now())
	if err != nil || !formed {
		return err
	}
	s.publish(ctx, g.ID) // its GroupFormed, if this call or a join's commit wrote it
	g.FormedAt = at
	return s.formedReachesRedis(ctx, g)
}

// formedReachesRedis tells Redis that MySQL has the group FORMED (no slot of
// it reopens there any more), then records that Redis knows. Whoever
// recorded FORMED — reserve, persist's join, the sweeper — Redis learns it
// here; what fails is retried by the sweeper (Ledger.UnsettledGroups).
func (s *Service) formedReachesRedis(ctx context.Context, g Group) error {
	at := g.FormedAt
	if at.IsZero() {
		at = g.Deadline
	}
	if _, err := s.slots.FormGroup(ctx, g, at); err != nil {
		return err
	}
	return s.ledger.GroupSettled(ctx, g.ID)
}

// groupFollowsMySQL runs before Redis follows a member's cancellation: if
// MySQL has the group FORMED, Redis is told first, so the member's leaving
// never reopens a slot of a formed group (which a join could then take).
func (s *Service) groupFollowsMySQL(ctx context.Context, row Reservation) error {
	g, err := s.ledger.Group(ctx, row.GroupID)
	if errors.Is(err, ErrUnknownGroup) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read group %s: %w", row.GroupID, err)
	}
	if g.Status != GroupFormed {
		return nil
	}
	return s.formedReachesRedis(ctx, g)
}
