package redisstore

// Holds: Reserve and Charge (reserve.lua, charge.lua), Follow and FollowAll
// (follow.lua, confirm.lua in chunks) that make a hold follow MySQL's
// decision, Hold and Expired that read holds back, AcceptJoin
// (group_accept.lua), and the reading of a hold hash into a Reservation.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Reserve implements reservation.Holds.
func (s *Store) Reserve(ctx context.Context, r reservation.Reservation, ttl time.Duration) (reservation.Reservation, reservation.ReserveOutcome, error) {
	var none reservation.ReserveOutcome
	args := []any{r.SKU, r.ID, r.Qty, r.UserID, r.GroupID, ttl.Milliseconds(), r.Token, s.now(), s.rate, s.burst, flag(r.AlreadyCharged),
		r.Ticket, r.TicketExpires.UnixMilli(), s.retentionMS()}
	res := reserveScript.Run(ctx, s.rdb, ReserveKeys(r), args...) // EVALSHA, EVAL on NOSCRIPT
	if err := res.Err(); err != nil {
		return reservation.Reservation{}, none, reservation.Unavailable("redis reserve", err)
	}
	out, err := res.StringSlice()
	if err != nil || len(out) == 0 {
		return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unexpected reply %v: %w", res.Val(), err)
	}
	// A refusal that may be the replay of a reservation Redis forgot says
	// whether the bucket holds every one (whole).
	refused := reservation.ReserveOutcome{Whole: len(out) == 2 && out[1] == "1"}
	switch out[0] {
	case "OK":
		if len(out) != 5 {
			return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unexpected reply %v", out)
		}
		deadline, _ := strconv.ParseInt(out[1], 10, 64)
		created, _ := strconv.ParseInt(out[2], 10, 64)
		r.ExpiresAt, r.CreatedAt, r.Status = time.UnixMilli(deadline).UTC(), time.UnixMilli(created).UTC(), reservation.StatusHeld
		return r, reservation.ReserveOutcome{Full: out[3] == "1", Whole: out[4] == "1"}, nil
	case "REPLAY":
		// follow.lua writes a tombstone where the bucket had no hold with
		// created 0; a hold reserve.lua took has its creation time.
		h, err := holdFromPairs(r.ID, r.Bucket, out[1:])
		return h, reservation.ReserveOutcome{Replayed: true, Tombstone: h.CreatedAt.IsZero()}, err
	case "MISMATCH":
		return reservation.Reservation{}, none, reservation.ErrIdempotencyMismatch
	case "RATE_LIMITED":
		ms := int64(1000)
		if len(out) > 1 {
			ms, _ = strconv.ParseInt(out[1], 10, 64)
		}
		return reservation.Reservation{}, none, &reservation.RateLimitedError{RetryAfter: time.Duration(ms) * time.Millisecond}
	case "NOT_OPEN":
		if len(out) != 3 {
			return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unexpected reply %v", out)
		}
		opens, _ := strconv.ParseInt(out[1], 10, 64)
		wait, _ := strconv.ParseInt(out[2], 10, 64)
		return reservation.Reservation{}, none, &reservation.NotOpenError{OpensAt: fromMS(opens), RetryAfter: time.Duration(wait) * time.Millisecond}
	case "SALE_CLOSED":
		return reservation.Reservation{}, refused, reservation.ErrSaleClosed
	case "NOT_ADMITTED":
		return reservation.Reservation{}, none, reservation.ErrAdmissionRequired
	case "ADMISSION_LAPSED":
		return reservation.Reservation{}, refused, reservation.ErrAdmissionExpired
	case "UNKNOWN_SKU":
		return reservation.Reservation{}, none, reservation.ErrUnknownSKU
	case "SOLD_OUT":
		return reservation.Reservation{}, refused, reservation.ErrSoldOut
	case "LIMIT":
		return reservation.Reservation{}, refused, reservation.ErrLimitExceeded
	case "UNKNOWN_GROUP":
		return reservation.Reservation{}, none, reservation.ErrUnknownGroup
	case "GROUP_CLOSED":
		return reservation.Reservation{}, none, reservation.ErrGroupClosed
	case "ALREADY_JOINED":
		return reservation.Reservation{}, none, reservation.ErrAlreadyJoined
	case "GROUP_FULL":
		return reservation.Reservation{}, none, reservation.ErrGroupFull
	}
	return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unknown code %q", out[0])
}

// Charge implements reservation.Holds.
func (s *Store) Charge(ctx context.Context, a reservation.Attempt) error {
	k := keysOf(reservation.BucketName(a.SKU, a.Bucket))
	var until int64
	if a.Group != "" {
		until = ms(a.Until)
	}
	out, err := chargeScript.Run(ctx, s.rdb, []string{k.meta(), k.attempts(a.UserID), k.opened(a.UserID)},
		s.now(), s.rate, s.burst, a.Token, a.Group, until, a.MaxOpen).StringSlice()
	if err != nil {
		return reservation.Unavailable("redis charge", err)
	}
	if len(out) == 0 {
		return fmt.Errorf("redis charge: empty reply")
	}
	wait := time.Second
	if len(out) > 1 {
		if n, err := strconv.ParseInt(out[1], 10, 64); err == nil {
			wait = time.Duration(n) * time.Millisecond
		}
	}
	switch out[0] {
	case "OK":
		return nil
	case "RATE_LIMITED":
		return &reservation.RateLimitedError{RetryAfter: wait}
	case "TOO_MANY_GROUPS":
		return &reservation.TooManyGroupsError{RetryAfter: wait}
	}
	return fmt.Errorf("redis charge: unknown code %q", out[0])
}

// Follow implements reservation.Holds.
func (s *Store) Follow(ctx context.Context, row reservation.Reservation, version int64) (bool, error) {
	return s.follow(ctx, row, version, "")
}

// followElsewhere is follow.lua's code in its reply {3, group}: the hold is
// a HELD stray of another group than the row's, and nothing changed; the
// call is made again naming that group, so that the script has its keys.
const followElsewhere = 3

// follow runs follow.lua for row, naming elsewhere as the group of a stray
// held in another group ("": none known), and again naming the group the
// script found, if it answers followElsewhere. Each call changes nothing or
// follows once; a stray whose group changed between the calls is named again.
func (s *Store) follow(ctx context.Context, row reservation.Reservation, version int64, elsewhere string) (bool, error) {
	k := keysOfHold(row)
	for range 3 {
		code, group, err := followReply(followScript.Run(ctx, s.rdb, k.followKeys(row, elsewhere), s.followArgs(row, version, elsewhere)...).Result())
		if err != nil {
			return false, err
		}
		if code != followElsewhere {
			return followed(row, code)
		}
		elsewhere = group
	}
	return false, reservation.Unavailable("redis follow", fmt.Errorf("%s: the stray's group changed at every call", row.ID))
}

// followReply reads follow.lua's reply: a code, or {followElsewhere, group}.
func followReply(v any, err error) (code int64, group string, _ error) {
	if err != nil {
		return 0, "", reservation.Unavailable("redis follow", err)
	}
	switch r := v.(type) {
	case int64:
		return r, "", nil
	case []any:
		if len(r) == 2 {
			code, ok1 := r[0].(int64)
			group, ok2 := r[1].(string)
			if ok1 && ok2 && code == followElsewhere {
				return code, group, nil
			}
		}
	}
	return 0, "", fmt.Errorf("redis follow: unexpected reply %v", v)
}

// followed is Follow's answer for follow.lua's code 0, 1 or 2 (a refund
// needs the stock: ErrUnknownSKU, warm it and follow again).
func followed(row reservation.Reservation, code int64) (bool, error) {
	if code == 2 {
		return false, fmt.Errorf("redis follow %s: a refund needs the stock: %w", row.ID, reservation.ErrUnknownSKU)
	}
	return code == 1, nil
}

// confirmChunk is how many holds one confirm.lua call confirms: about a
// millisecond of Redis's single thread, so reserves never wait long behind it.
const confirmChunk = 200

// FollowAll implements reservation.Holds. The common case of persist's
// batch — CONFIRMED rows without a group whose holds are HELD with the
// decided token — goes to confirm.lua, confirmChunk holds a call; the rest
// follow.lua, one call a row. All calls go in one pipeline (per shard); a
// script Redis does not have yet is loaded and the pipeline sent again
// (both scripts are idempotent). A row whose hold is a stray of another
// group is followed again on its own, naming that group (Follow).
func (s *Store) FollowAll(ctx context.Context, rows []reservation.Reservation, version int64) ([]bool, []error) {
	returned, errs := make([]bool, len(rows)), make([]error, len(rows))
	var plain []int // rows confirm.lua may take, by SKU order of arrival
	var rest []int
	for i, row := range rows {
		if row.Status == reservation.StatusConfirmed && row.GroupID == "" && row.Token != "" {
			plain = append(plain, i)
		} else {
			rest = append(rest, i)
		}
	}
	chunks := chunkBySKU(rows, plain)
	confirms, err := s.pipeline(ctx, func(p redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(chunks))
		for c, chunk := range chunks {
			k := keysOfHold(rows[chunk[0]])
			ks := make([]string, 0, 3+len(chunk))
			ks = append(ks, k.meta(), k.exp(), k.unpaid())
			args := make([]any, 0, 3+3*len(chunk))
			args = append(args, version, int64(s.retention.Seconds()), s.now())
			for _, i := range chunk {
				ks = append(ks, k.hold(rows[i].ID))
				args = append(args, rows[i].ID, rows[i].Token, payByMS(rows[i]))
			}
			cmds[c] = confirmScript.EvalSha(ctx, p, ks, args...)
		}
		return cmds
	}, confirmScript)
	if err != nil {
		rest = append(rest, plain...)
	} else {
		for c, chunk := range chunks {
			skipped, err := confirms[c].Int64Slice()
			if err != nil {
				rest = append(rest, chunk...) // follow.lua decides them
				continue
			}
			for _, k := range skipped {
				if k >= 1 && int(k) <= len(chunk) {
					rest = append(rest, chunk[k-1])
				}
			}
		}
	}
	if len(rest) == 0 {
		return returned, errs
	}
	follows, err := s.pipeline(ctx, func(p redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(rest))
		for j, i := range rest {
			cmds[j] = followScript.EvalSha(ctx, p, keysOfHold(rows[i]).followKeys(rows[i], ""), s.followArgs(rows[i], version, "")...)
		}
		return cmds
	}, followScript)
	for j, i := range rest {
		if err != nil {
			errs[i] = err
			continue
		}
		code, group, err := followReply(follows[j].Result())
		switch {
		case err != nil:
			errs[i] = err
		case code == followElsewhere:
			returned[i], errs[i] = s.follow(ctx, rows[i], version, group)
		default:
			returned[i], errs[i] = followed(rows[i], code)
		}
	}
	return returned, errs
}

// chunkBySKU splits the rows at idx into runs of one SKU's bucket of at
// most confirmChunk rows, keeping their order within a bucket.
func chunkBySKU(rows []reservation.Reservation, idx []int) [][]int {
	bySKU := map[string][]int{}
	var order []string
	for _, i := range idx {
		sku := reservation.BucketName(rows[i].SKU, rows[i].Bucket)
		if _, ok := bySKU[sku]; !ok {
			order = append(order, sku)
		}
		bySKU[sku] = append(bySKU[sku], i)
	}
	var out [][]int
	for _, sku := range order {
		for all := bySKU[sku]; len(all) > 0; {
			n := min(len(all), confirmChunk)
			out = append(out, all[:n])
			all = all[n:]
		}
	}
	return out
}

// followArgs are follow.lua's ARGV for row: its sub-states as the flags the
// script reads (refunded, and released: "0" only while the release is
// owed); elsewhere names the group of a stray held in another group than the
// row's ("": none known).
func (s *Store) followArgs(row reservation.Reservation, version int64, elsewhere string) []any {
	return []any{row.SKU, row.ID, row.Token, row.Qty, row.UserID, row.GroupID, string(row.Status),
		flag(row.Cancellation == reservation.Refunded), flag(row.Release != reservation.ReleaseOwed),
		string(row.Reason), int64(s.retention.Seconds()), version, row.RefundVersion, s.now(),
		flag(row.Status == reservation.StatusCancelled && !row.Reason.CountsInGroup()), elsewhere,
		payByMS(row), flag(!row.PaidAt.IsZero())}
}

// payByMS is the row's pay_by as the scripts take it: unix ms, 0 when it
// has no pay window or is paid (it can no longer return unpaid).
func payByMS(row reservation.Reservation) int64 {
	if row.PayBy.IsZero() || !row.PaidAt.IsZero() {
		return 0
	}
	return row.PayBy.UnixMilli()
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Hold implements reservation.Holds. The id names its SKU, so one read
// finds the hold in the bucket named.
func (s *Store) Hold(ctx context.Context, id string, bucket int) (reservation.Reservation, error) {
	sku, ok := reservation.SKUOf(id)
	if !ok {
		return reservation.Reservation{}, reservation.ErrNotFound
	}
	m, err := s.rdb.HGetAll(ctx, keysOf(reservation.BucketName(sku, bucket)).hold(id)).Result()
	if err != nil {
		return reservation.Reservation{}, reservation.Unavailable("redis hold", err)
	}
	if len(m) == 0 || m["state"] == "CREDITED" || m["state"] == "AHEAD" { // a transfer's mark, not a hold
		return reservation.Reservation{}, reservation.ErrNotFound
	}
	return holdFromMap(id, bucket, m)
}

// Expired implements reservation.Holds.
func (s *Store) Expired(ctx context.Context, sku string, grace time.Duration, limit int) ([]reservation.Reservation, error) {
	k := keysOf(sku)
	_, bucket := reservation.ParseBucket(sku)
	ids, err := expiredScript.Run(ctx, s.rdb, []string{k.exp()}, grace.Milliseconds(), limit, s.now()).StringSlice()
	if err != nil {
		return nil, reservation.Unavailable("redis expired", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGetAll(ctx, k.hold(id))
		}
		return nil
	})
	if err != nil {
		return nil, reservation.Unavailable("redis expired holds", err)
	}
	out := make([]reservation.Reservation, 0, len(ids))
	for i, id := range ids {
		m := cmds[i].Val()
		if len(m) == 0 {
			// The hold itself is gone (data loss): nothing to release here;
			// drop the index entry so the sweep does not spin on it.
			s.rdb.ZRem(ctx, k.exp(), id)
			continue
		}
		h, err := holdFromMap(id, bucket, m)
		if err != nil {
			return nil, err
		}
		if h.Status == reservation.StatusHeld {
			out = append(out, h)
		}
	}
	return out, nil
}

// AcceptJoin implements reservation.Holds.
func (s *Store) AcceptJoin(ctx context.Context, r reservation.Reservation) (bool, error) {
	k := keysOfHold(r)
	out, err := groupAcceptScript.Run(ctx, s.rdb, []string{k.hold(r.ID), k.group(r.GroupID)}, r.Token).Int64Slice()
	if err != nil {
		return false, reservation.Unavailable("redis accept join", err)
	}
	if len(out) != 2 {
		return false, fmt.Errorf("redis accept join %s: reply %v", r.ID, out)
	}
	if out[0] != 1 {
		return false, fmt.Errorf("accept join %s: the hold is not held any more: %w", r.ID, reservation.ErrNotFound)
	}
	return out[1] == 0, nil
}

func holdFromPairs(id string, bucket int, kv []string) (reservation.Reservation, error) {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return holdFromMap(id, bucket, m)
}

// holdFromMap reads a hold hash of the bucket numbered bucket.
func holdFromMap(id string, bucket int, m map[string]string) (reservation.Reservation, error) {
	qty, err := strconv.Atoi(m["qty"])
	if err != nil {
		return reservation.Reservation{}, fmt.Errorf("hold %s: bad qty %q", id, m["qty"])
	}
	deadline, _ := strconv.ParseInt(m["deadline"], 10, 64)
	created, _ := strconv.ParseInt(m["created"], 10, 64)
	r := reservation.Reservation{
		ID: id, SKU: m["sku"], Qty: qty, UserID: m["user"], GroupID: m["group"],
		Token: m["token"], Status: reservation.Status(m["state"]), Reason: reservation.Reason(m["reason"]),
		Bucket: bucket, Sent: m["sent"] == "1",
	}
	if r.Status == reservation.StatusCancelled { // a tombstone's field refunded (follow.lua)
		r.Cancellation = reservation.Fenced
		if m["refunded"] == "1" {
			r.Cancellation = reservation.Refunded
		}
	}
	if into, ok := m["into"]; ok {
		r.Transfer = true
		r.Into, _ = strconv.Atoi(into)
	}
	if deadline > 0 {
		r.ExpiresAt = time.UnixMilli(deadline).UTC()
	}
	if created > 0 {
		r.CreatedAt = time.UnixMilli(created).UTC()
	}
	return r, nil
}
