// Package redisstore is the Redis adapter of the reservation protocol: the
// stock buyers see, holds and group slots, changed only by the Lua scripts in
// lua/ so that every change is atomic and safe to repeat. All keys of one
// bucket of a SKU share its hash tag — {sku} for bucket 0, {sku#b} for bucket
// b — so each script touches one cluster slot, and a SKU's K buckets can sit
// on K shards.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/clock.lua
	clockLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/follow.lua
	followLua string
	//go:embed lua/expired.lua
	expiredLua string
	//go:embed lua/stock.lua
	stockLua string
	//go:embed lua/warm.lua
	warmLua string
	//go:embed lua/group_create.lua
	groupCreateLua string
	//go:embed lua/group_close.lua
	groupCloseLua string
	//go:embed lua/group_form.lua
	groupFormLua string
	//go:embed lua/heal.lua
	healLua string
	//go:embed lua/confirm.lua
	confirmLua string
	//go:embed lua/touch.lua
	touchLua string
	//go:embed lua/unmark.lua
	unmarkLua string
	//go:embed lua/takeout.lua
	takeoutLua string
	//go:embed lua/credit.lua
	creditLua string
	//go:embed lua/charge.lua
	chargeLua string
	//go:embed lua/budget.lua
	budgetLua string
	//go:embed lua/group_accept.lua
	groupAcceptLua string
)

// ReserveLua is the reserve script's source (with its clock and budget preludes), for
// tools that measure the raw script (make bench's floor); ReserveKeys and
// ReserveArgs give its KEYS and ARGV.
var ReserveLua = clockLua + budgetLua + reserveLua

// ReserveKeys returns the KEYS of reserve.lua for a reservation.
func ReserveKeys(r reservation.Reservation) []string {
	k := keysOfHold(r)
	return append(k.holdKeys(r), k.budget(r.UserID))
}

// ReserveArgs returns the ARGV of reserve.lua for a reservation, reading the
// time from Redis as production does, with rate and burst as the per-user
// attempt defaults.
func ReserveArgs(r reservation.Reservation, ttl time.Duration, rate, burst int) []any {
	return []any{r.SKU, r.ID, r.Qty, r.UserID, r.GroupID, ttl.Milliseconds(), r.Token, "", rate, burst}
}

var (
	reserveScript     = redis.NewScript(ReserveLua)
	followScript      = redis.NewScript(clockLua + followLua)
	expiredScript     = redis.NewScript(clockLua + expiredLua)
	stockScript       = redis.NewScript(stockLua)
	warmScript        = redis.NewScript(warmLua)
	groupCreateScript = redis.NewScript(groupCreateLua)
	groupCloseScript  = redis.NewScript(clockLua + groupCloseLua)
	groupFormScript   = redis.NewScript(groupFormLua)
	groupAcceptScript = redis.NewScript(groupAcceptLua)
	healScript        = redis.NewScript(clockLua + healLua)
	confirmScript     = redis.NewScript(confirmLua)
	touchScript       = redis.NewScript(clockLua + touchLua)
	unmarkScript      = redis.NewScript(clockLua + unmarkLua)
	takeoutScript     = redis.NewScript(clockLua + takeoutLua)
	creditScript      = redis.NewScript(creditLua)
	chargeScript      = redis.NewScript(clockLua + budgetLua + chargeLua)
)

var _ reservation.Redis = (*Store)(nil)

// Store keeps holds in Redis (standalone or cluster).
type Store struct {
	rdb redis.UniversalClient
	// retention is how long a finished hold is kept so that a replayed
	// request finds it.
	retention time.Duration
	// clock, when set, replaces Redis's clock in the scripts: tests move
	// time with it. Production leaves it nil, so scripts read TIME.
	clock reservation.Clock
	// rate and burst are the per-user attempt limits of a SKU that sets
	// none (0: none).
	rate, burst int
	// sweep names the sweeper's keys (live SKUs, catalog cursor) of the
	// ledger this Store serves (WithLedger).
	sweep sweepKeys
}

// Option adjusts a Store.
type Option func(*Store)

// WithClock makes the scripts take the time from c instead of Redis's own
// clock. For tests that move time; production never sets it.
func WithClock(c reservation.Clock) Option { return func(s *Store) { s.clock = c } }

// WithUserRate sets the per-user reserve attempts per second and burst for
// SKUs that set none of their own.
func WithUserRate(rate, burst int) Option {
	return func(s *Store) { s.rate, s.burst = rate, burst }
}

// WithLedger names the MySQL ledger (its database) whose sweeper state
// this Store keeps, so that ledgers sharing one Redis (the tests' databases)
// keep apart the SKUs they mark live and their catalog cursors. The SKUs'
// own keys carry no ledger: one Redis serves one stage.
func WithLedger(name string) Option {
	return func(s *Store) { s.sweep = sweepKeysOf(name) }
}

// New returns a Store. retention is how long finished holds stay readable
// for replays and status polls (24h if zero).
func New(rdb redis.UniversalClient, retention time.Duration, opts ...Option) *Store {
	if retention <= 0 {
		retention = 24 * time.Hour
	}
	s := &Store{rdb: rdb, retention: retention, sweep: sweepKeysOf("")}
	for _, o := range opts {
		o(s)
	}
	return s
}

// now is the ARGV a script reads the time from: "" for Redis's clock.
func (s *Store) now() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().UnixMilli(), 10)
}

// keys names every key of one bucket of a SKU (its name: see
// reservation.BucketName). Scripts never build key names.
type keys struct{ tag string }

func keysOf(bucket string) keys { return keys{tag: "hf:{" + bucket + "}"} }

// keysOfHold names the keys of the bucket r's hold is in.
func keysOfHold(r reservation.Reservation) keys {
	return keysOf(reservation.BucketName(r.SKU, r.Bucket))
}

func (k keys) stock() string             { return k.tag + ":stock" }
func (k keys) meta() string              { return k.tag + ":meta" }
func (k keys) exp() string               { return k.tag + ":exp" }
func (k keys) users() string             { return k.tag + ":users" }
func (k keys) hold(id string) string     { return k.tag + ":r:" + id }
func (k keys) group(gid string) string   { return k.tag + ":g:" + gid }
func (k keys) members(gid string) string { return k.tag + ":gm:" + gid }
func (k keys) budget(user string) string { return k.tag + ":rl:" + user }
func (k keys) opened(user string) string { return k.tag + ":og:" + user }
func (k keys) holdKeys(r reservation.Reservation) []string {
	// The group keys are placeholders (never written) when there is no group.
	return []string{k.stock(), k.meta(), k.exp(), k.users(), k.hold(r.ID), k.group(r.GroupID), k.members(r.GroupID)}
}

// sweepKeys names the sweeper's keys of one ledger. Their hash tag starts
// with '#', which no SKU may contain, so it never names a SKU's slot.
type sweepKeys struct{ tag string }

func sweepKeysOf(ledger string) sweepKeys { return sweepKeys{tag: "hf:{#sweep:" + ledger + "}"} }

func (k sweepKeys) live() string   { return k.tag + ":live" }
func (k sweepKeys) cursor() string { return k.tag + ":cursor" }

func ms(t time.Time) int64 { return t.UnixMilli() }

// Reserve implements reservation.Holds.
func (s *Store) Reserve(ctx context.Context, r reservation.Reservation, ttl time.Duration) (reservation.Reservation, reservation.ReserveOutcome, error) {
	var none reservation.ReserveOutcome
	args := []any{r.SKU, r.ID, r.Qty, r.UserID, r.GroupID, ttl.Milliseconds(), r.Token, s.now(), s.rate, s.burst, flag(r.Charged)}
	res := reserveScript.Run(ctx, s.rdb, ReserveKeys(r), args...) // EVALSHA, EVAL on NOSCRIPT
	if err := res.Err(); err != nil {
		return reservation.Reservation{}, none, reservation.Unavailable("redis reserve", err)
	}
	out, err := res.StringSlice()
	if err != nil || len(out) == 0 {
		return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unexpected reply %v: %w", res.Val(), err)
	}
	switch out[0] {
	case "OK":
		if len(out) != 4 {
			return reservation.Reservation{}, none, fmt.Errorf("redis reserve: unexpected reply %v", out)
		}
		deadline, _ := strconv.ParseInt(out[1], 10, 64)
		created, _ := strconv.ParseInt(out[2], 10, 64)
		r.ExpiresAt, r.CreatedAt, r.Status = time.UnixMilli(deadline).UTC(), time.UnixMilli(created).UTC(), reservation.StatusHeld
		return r, reservation.ReserveOutcome{Full: out[3] == "1"}, nil
	case "REPLAY":
		h, err := holdFromPairs(r.ID, r.Bucket, out[1:])
		return h, reservation.ReserveOutcome{Replayed: true}, err
	case "MISMATCH":
		return reservation.Reservation{}, none, reservation.ErrIdempotencyMismatch
	case "RATE_LIMITED":
		ms := int64(1000)
		if len(out) > 1 {
			ms, _ = strconv.ParseInt(out[1], 10, 64)
		}
		return reservation.Reservation{}, none, &reservation.RateLimitedError{RetryAfter: time.Duration(ms) * time.Millisecond}
	case "UNKNOWN_SKU":
		return reservation.Reservation{}, none, reservation.ErrUnknownSKU
	case "SOLD_OUT":
		return reservation.Reservation{}, none, reservation.ErrSoldOut
	case "LIMIT":
		return reservation.Reservation{}, none, reservation.ErrLimitExceeded
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
	out, err := chargeScript.Run(ctx, s.rdb, []string{k.meta(), k.budget(a.UserID), k.opened(a.UserID)},
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
	k := keysOfHold(row)
	n, err := followScript.Run(ctx, s.rdb, k.holdKeys(row), s.followArgs(row, version)...).Int()
	if err != nil {
		return false, reservation.Unavailable("redis follow", err)
	}
	if n == 2 {
		return false, fmt.Errorf("redis follow %s: a refund needs the stock: %w", row.ID, reservation.ErrUnknownSKU)
	}
	return n == 1, nil
}

// confirmChunk is how many holds one confirm.lua call confirms: about a
// millisecond of Redis's single thread, so reserves never wait long behind it.
const confirmChunk = 200

// FollowAll implements reservation.Holds. The common case of persist's
// batch — CONFIRMED rows without a group whose holds are HELD with the
// decided token — goes to confirm.lua, confirmChunk holds a call; the rest
// follow.lua, one call a row. All calls go in one pipeline (per shard); a
// script Redis does not have yet is loaded and the pipeline sent again
// (both scripts are idempotent).
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
			ks := make([]string, 0, 2+len(chunk))
			ks = append(ks, k.meta(), k.exp())
			args := make([]any, 0, 2+2*len(chunk))
			args = append(args, version, int64(s.retention.Seconds()))
			for _, i := range chunk {
				ks = append(ks, k.hold(rows[i].ID))
				args = append(args, rows[i].ID, rows[i].Token)
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
			cmds[j] = followScript.EvalSha(ctx, p, keysOfHold(rows[i]).holdKeys(rows[i]), s.followArgs(rows[i], version)...)
		}
		return cmds
	}, followScript)
	for j, i := range rest {
		if err != nil {
			errs[i] = err
			continue
		}
		n, err := follows[j].Int()
		switch {
		case err != nil:
			errs[i] = reservation.Unavailable("redis follow", err)
		case n == 2:
			errs[i] = fmt.Errorf("redis follow %s: a refund needs the stock: %w", rows[i].ID, reservation.ErrUnknownSKU)
		default:
			returned[i] = n == 1
		}
	}
	return returned, errs
}

// pipeline sends the commands build queues in one pipeline and returns
// them; if Redis lacks script it loads it and sends them again.
func (s *Store) pipeline(ctx context.Context, build func(redis.Pipeliner) []*redis.Cmd, script *redis.Script) ([]*redis.Cmd, error) {
	var cmds []*redis.Cmd
	send := func() {
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmds = build(p)
			return nil
		})
	}
	send()
	for _, c := range cmds {
		if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			if err := script.Load(ctx, s.rdb).Err(); err != nil {
				return nil, reservation.Unavailable("redis load script", err)
			}
			send()
			break
		}
	}
	return cmds, nil
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

func (s *Store) followArgs(row reservation.Reservation, version int64) []any {
	return []any{row.SKU, row.ID, row.Token, row.Qty, row.UserID, row.GroupID, string(row.Status), flag(row.Refunded), flag(row.Released),
		string(row.Reason), int64(s.retention.Seconds()), version, row.RefundVersion, s.now(),
		flag(row.Status == reservation.StatusCancelled && !row.Reason.CountsInGroup())}
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
	if len(m) == 0 || m["state"] == "CREDITED" {
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

// Stock implements reservation.Holds.
func (s *Store) Stock(ctx context.Context, sku string) (reservation.RedisStock, error) {
	k := keysOf(sku)
	var stock *redis.StringCmd
	var meta *redis.SliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		stock = p.Get(ctx, k.stock())
		meta = p.HMGet(ctx, k.meta(), "held", "added", "ver", "moving")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return reservation.RedisStock{}, reservation.Unavailable("redis stock", err)
	}
	rs := reservation.RedisStock{SKU: sku}
	rs.Available, err = stock.Int64()
	if errors.Is(err, redis.Nil) {
		return reservation.RedisStock{}, reservation.ErrUnknownSKU
	}
	if err != nil {
		return reservation.RedisStock{}, fmt.Errorf("redis stock %s: %w", sku, err)
	}
	for i, dst := range []*int64{&rs.Held, &rs.AdminDelta, &rs.Version, &rs.Moving} {
		if v, ok := meta.Val()[i].(string); ok {
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return reservation.RedisStock{}, fmt.Errorf("redis meta %s: %w", sku, err)
			}
		}
	}
	return rs, nil
}

// Sync implements reservation.Holds.
func (s *Store) Sync(ctx context.Context, level reservation.StockLevel) (reservation.SyncResult, error) {
	k := keysOf(level.SKU)
	n, err := stockScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()}, level.Version, level.PerUserLimit, level.AdminDelta,
		level.UserRate, level.UserBurst, level.BucketCount()).Int()
	if err != nil {
		return reservation.SyncNone, reservation.Unavailable("redis sync stock", err)
	}
	switch n {
	case 2:
		return reservation.SyncAdjusted, nil
	case 4:
		return reservation.SyncMissing, nil
	}
	return reservation.SyncNone, nil
}

// HeldIDs implements reservation.Holds.
func (s *Store) HeldIDs(ctx context.Context, sku string, limit int) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, keysOf(sku).exp(), 0, int64(limit)-1).Result()
	if err != nil {
		return nil, reservation.Unavailable("redis held ids", err)
	}
	return ids, nil
}

// Warm implements reservation.Holds.
func (s *Store) Warm(ctx context.Context, level reservation.StockLevel, held []string, confirmed []reservation.Reservation) (reservation.SyncResult, error) {
	k := keysOf(level.SKU)
	token := make(map[string]string, len(confirmed))
	for _, r := range confirmed {
		token[r.ID] = r.Token
	}
	ks := make([]string, 0, 2+len(held))
	ks = append(ks, k.stock(), k.meta())
	args := make([]any, 0, 7+2*len(held))
	args = append(args, level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst, level.BucketCount())
	for _, id := range held {
		ks = append(ks, k.hold(id))
		if t, ok := token[id]; ok {
			args = append(args, "1", t)
		} else {
			args = append(args, "0", "")
		}
	}
	n, err := warmScript.Run(ctx, s.rdb, ks, args...).Int()
	if err != nil {
		return reservation.SyncNone, reservation.Unavailable("redis warm", err)
	}
	switch n {
	case 1:
		return reservation.SyncWarmed, nil
	case 3:
		return reservation.SyncStale, nil
	}
	return reservation.SyncNone, nil
}

// Now implements reservation.Holds.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.clock != nil {
		return s.clock.Now(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, reservation.Unavailable("redis time", err)
	}
	return t.UTC(), nil
}

// Heal implements reservation.Holds.
func (s *Store) Heal(ctx context.Context, seen reservation.RedisStock, drift int64, after time.Duration) (bool, error) {
	k := keysOf(seen.SKU)
	n, err := healScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()},
		seen.Available, seen.Held, drift, after.Milliseconds(), s.now()).Int()
	if err != nil {
		return false, reservation.Unavailable("redis heal", err)
	}
	return n == 1, nil
}

// CreateGroup implements reservation.Holds.
func (s *Store) CreateGroup(ctx context.Context, g reservation.Group) error {
	k := keysOf(g.SKU)
	err := groupCreateScript.Run(ctx, s.rdb, []string{k.group(g.ID), k.meta()},
		g.Capacity, ms(g.Deadline), ms(g.Deadline.Add(s.retention))).Err()
	if err != nil {
		return reservation.Unavailable("redis create group", err)
	}
	return nil
}

// Group implements reservation.Holds.
func (s *Store) Group(ctx context.Context, sku, id string) (reservation.Group, error) {
	m, err := s.rdb.HGetAll(ctx, keysOf(sku).group(id)).Result()
	if err != nil {
		return reservation.Group{}, reservation.Unavailable("redis group", err)
	}
	if len(m) == 0 {
		return reservation.Group{}, reservation.ErrUnknownGroup
	}
	g := reservation.Group{ID: id, SKU: sku, Status: reservation.GroupStatus(m["status"])}
	g.Capacity, _ = strconv.Atoi(m["capacity"])
	g.Remaining, _ = strconv.Atoi(m["remaining"])
	d, _ := strconv.ParseInt(m["deadline"], 10, 64)
	g.Deadline = time.UnixMilli(d).UTC()
	if f, _ := strconv.ParseInt(m["formed_at"], 10, 64); f > 0 {
		g.FormedAt = time.UnixMilli(f).UTC()
	}
	if f, _ := strconv.ParseInt(m["full_at"], 10, 64); f > 0 && g.Remaining <= 0 {
		g.FullAt = time.UnixMilli(f).UTC()
	}
	return g, nil
}

// FormGroup implements reservation.Holds.
func (s *Store) FormGroup(ctx context.Context, g reservation.Group, formedAt time.Time) (bool, error) {
	n, err := groupFormScript.Run(ctx, s.rdb, []string{keysOf(g.SKU).group(g.ID)}, ms(formedAt)).Int()
	if err != nil {
		return false, reservation.Unavailable("redis form group", err)
	}
	return n == 1, nil
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

// GroupHoldersAccepted implements reservation.Holds: the group's members
// hash, then each member's hold, in one pipeline.
func (s *Store) GroupHoldersAccepted(ctx context.Context, g reservation.Group) (bool, error) {
	k := keysOf(g.SKU)
	members, err := s.rdb.HGetAll(ctx, k.members(g.ID)).Result()
	if err != nil {
		return false, reservation.Unavailable("redis group members", err)
	}
	if len(members) == 0 {
		return true, nil
	}
	cmds := make([]*redis.SliceCmd, 0, len(members))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range members {
			cmds = append(cmds, p.HMGet(ctx, k.hold(id), "state", "sent"))
		}
		return nil
	})
	if err != nil {
		return false, reservation.Unavailable("redis group holds", err)
	}
	for _, c := range cmds {
		v := c.Val()
		if len(v) == 2 && v[0] == "HELD" && v[1] == nil {
			return false, nil // sent not yet: its send may still fail
		}
	}
	return true, nil
}

// CloseGroup implements reservation.Holds.
func (s *Store) CloseGroup(ctx context.Context, g reservation.Group) (reservation.GroupClosing, error) {
	k := keysOf(g.SKU)
	out, err := groupCloseScript.Run(ctx, s.rdb, []string{k.group(g.ID), k.members(g.ID)}, s.now()).StringSlice()
	if err != nil {
		return reservation.GroupClosing{}, reservation.Unavailable("redis close group", err)
	}
	return closing(g.ID, out)
}

// CloseGroups implements reservation.Holds: group_close.lua for each group,
// all in one pipeline (per shard).
func (s *Store) CloseGroups(ctx context.Context, gs []reservation.Group) ([]reservation.GroupClosing, []error) {
	out, errs := make([]reservation.GroupClosing, len(gs)), make([]error, len(gs))
	if len(gs) == 0 {
		return out, errs
	}
	now := s.now()
	cmds, err := s.pipeline(ctx, func(p redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(gs))
		for i, g := range gs {
			k := keysOf(g.SKU)
			cmds[i] = groupCloseScript.EvalSha(ctx, p, []string{k.group(g.ID), k.members(g.ID)}, now)
		}
		return cmds
	}, groupCloseScript)
	for i, g := range gs {
		if err != nil {
			errs[i] = err
			continue
		}
		reply, cerr := cmds[i].StringSlice()
		if cerr != nil {
			errs[i] = reservation.Unavailable("redis close group", cerr)
			continue
		}
		out[i], errs[i] = closing(g.ID, reply)
	}
	return out, errs
}

// closing reads group_close.lua's reply.
func closing(id string, out []string) (reservation.GroupClosing, error) {
	if len(out) == 0 {
		return reservation.GroupClosing{}, fmt.Errorf("redis close group %s: empty reply", id)
	}
	switch out[0] {
	case "UNKNOWN":
		return reservation.GroupClosing{Unknown: true}, nil
	case "NOT_DUE":
		return reservation.GroupClosing{NotDue: true}, nil
	case "FORMED":
		c := reservation.GroupClosing{Status: reservation.GroupFormed}
		if len(out) > 1 {
			if f, _ := strconv.ParseInt(out[1], 10, 64); f > 0 {
				c.FormedAt = time.UnixMilli(f).UTC()
			}
		}
		return c, nil
	case "FULL":
		c := reservation.GroupClosing{Full: true}
		if len(out) > 1 {
			if f, _ := strconv.ParseInt(out[1], 10, 64); f > 0 {
				c.FullAt = time.UnixMilli(f).UTC()
			}
		}
		return c, nil
	case "FAILED":
		return reservation.GroupClosing{Status: reservation.GroupFailed, Holders: out[1:]}, nil
	}
	return reservation.GroupClosing{}, fmt.Errorf("redis close group %s: unknown code %q", id, out[0])
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
		Refunded: m["refunded"] == "1", Bucket: bucket, Sent: m["sent"] == "1",
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
