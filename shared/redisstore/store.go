// Package redisstore is the Redis adapter of the reservation protocol: the
// stock buyers see, holds and group slots, changed only by the Lua scripts in
// lua/ so that every change is atomic and safe to repeat. All keys of one SKU
// share the hash tag {sku}, so each script touches one cluster slot.
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
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/confirm.lua
	confirmLua string
	//go:embed lua/stock.lua
	stockLua string
	//go:embed lua/group_create.lua
	groupCreateLua string
	//go:embed lua/group_close.lua
	groupCloseLua string
	//go:embed lua/heal.lua
	healLua string
)

// ReserveLua is the reserve script's source, for tools that measure the
// raw script (make bench's floor); ReserveKeys gives its KEYS.
var ReserveLua = reserveLua

// ReserveKeys returns the KEYS of reserve.lua for a reservation.
func ReserveKeys(r reservation.Reservation) []string { return keysOf(r.SKU).holdKeys(r) }

var (
	reserveScript     = redis.NewScript(reserveLua)
	releaseScript     = redis.NewScript(releaseLua)
	confirmScript     = redis.NewScript(confirmLua)
	stockScript       = redis.NewScript(stockLua)
	groupCreateScript = redis.NewScript(groupCreateLua)
	groupCloseScript  = redis.NewScript(groupCloseLua)
	healScript        = redis.NewScript(healLua)
)

var _ reservation.Holds = (*Store)(nil)

// Store keeps holds in Redis (standalone or cluster).
type Store struct {
	rdb redis.UniversalClient
	// retention is how long a finished hold is kept so that a replayed
	// request finds it.
	retention time.Duration
}

// New returns a Store. retention is how long finished holds stay readable
// for replays and status polls (24h if zero).
func New(rdb redis.UniversalClient, retention time.Duration) *Store {
	if retention <= 0 {
		retention = 24 * time.Hour
	}
	return &Store{rdb: rdb, retention: retention}
}

// keys names every key of one SKU. Scripts never build key names.
type keys struct{ tag string }

func keysOf(sku string) keys { return keys{tag: "hf:{" + sku + "}"} }

func (k keys) stock() string             { return k.tag + ":stock" }
func (k keys) meta() string              { return k.tag + ":meta" }
func (k keys) exp() string               { return k.tag + ":exp" }
func (k keys) users() string             { return k.tag + ":users" }
func (k keys) hold(id string) string     { return k.tag + ":r:" + id }
func (k keys) group(gid string) string   { return k.tag + ":g:" + gid }
func (k keys) members(gid string) string { return k.tag + ":gm:" + gid }
func (k keys) holdKeys(r reservation.Reservation) []string {
	// The group keys are placeholders (never written) when there is no group.
	return []string{k.stock(), k.meta(), k.exp(), k.users(), k.hold(r.ID), k.group(r.GroupID), k.members(r.GroupID)}
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// Reserve implements reservation.Holds.
func (s *Store) Reserve(ctx context.Context, r reservation.Reservation, now time.Time) (reservation.Reservation, bool, error) {
	k := keysOf(r.SKU)
	ks := k.holdKeys(r)
	args := []any{r.SKU, r.ID, r.Qty, r.UserID, r.GroupID, ms(r.ExpiresAt), ms(now)}
	res := reserveScript.Run(ctx, s.rdb, ks, args...) // EVALSHA, EVAL on NOSCRIPT
	if err := res.Err(); err != nil {
		return reservation.Reservation{}, false, reservation.Unavailable("redis reserve", err)
	}
	out, err := res.StringSlice()
	if err != nil || len(out) == 0 {
		return reservation.Reservation{}, false, fmt.Errorf("redis reserve: unexpected reply %v: %w", res.Val(), err)
	}
	switch out[0] {
	case "OK":
		return r, false, nil
	case "REPLAY":
		h, err := holdFromPairs(r.ID, out[1:])
		return h, true, err
	case "MISMATCH":
		return reservation.Reservation{}, false, reservation.ErrIdempotencyMismatch
	case "UNKNOWN_SKU":
		return reservation.Reservation{}, false, reservation.ErrUnknownSKU
	case "SOLD_OUT":
		return reservation.Reservation{}, false, reservation.ErrSoldOut
	case "LIMIT":
		return reservation.Reservation{}, false, reservation.ErrLimitExceeded
	case "UNKNOWN_GROUP":
		return reservation.Reservation{}, false, reservation.ErrUnknownGroup
	case "GROUP_CLOSED":
		return reservation.Reservation{}, false, reservation.ErrGroupClosed
	case "ALREADY_JOINED":
		return reservation.Reservation{}, false, reservation.ErrAlreadyJoined
	case "GROUP_FULL":
		return reservation.Reservation{}, false, reservation.ErrGroupFull
	}
	return reservation.Reservation{}, false, fmt.Errorf("redis reserve: unknown code %q", out[0])
}

// Release implements reservation.Holds.
func (s *Store) Release(ctx context.Context, r reservation.Reservation, refund bool) (bool, error) {
	k := keysOf(r.SKU)
	flag := "0"
	if refund {
		flag = "1"
	}
	n, err := releaseScript.Run(ctx, s.rdb, k.holdKeys(r),
		r.SKU, r.ID, flag, string(r.Reason), int64(s.retention.Seconds()), r.Qty, r.UserID, r.GroupID).Int()
	if err != nil {
		return false, reservation.Unavailable("redis release", err)
	}
	return n == 1, nil
}

// Confirm implements reservation.Holds.
func (s *Store) Confirm(ctx context.Context, r reservation.Reservation) error {
	k := keysOf(r.SKU)
	err := confirmScript.Run(ctx, s.rdb, []string{k.meta(), k.exp(), k.hold(r.ID)},
		r.ID, int64(s.retention.Seconds()), r.SKU, r.Qty, r.UserID, r.GroupID).Err()
	if err != nil {
		return reservation.Unavailable("redis confirm", err)
	}
	return nil
}

// Hold implements reservation.Holds. The id names its SKU, so one read
// finds the hold.
func (s *Store) Hold(ctx context.Context, id string) (reservation.Reservation, error) {
	sku, ok := reservation.SKUOf(id)
	if !ok {
		return reservation.Reservation{}, reservation.ErrNotFound
	}
	return s.holdOf(ctx, sku, id)
}

func (s *Store) holdOf(ctx context.Context, sku, id string) (reservation.Reservation, error) {
	m, err := s.rdb.HGetAll(ctx, keysOf(sku).hold(id)).Result()
	if err != nil {
		return reservation.Reservation{}, reservation.Unavailable("redis hold", err)
	}
	if len(m) == 0 {
		return reservation.Reservation{}, reservation.ErrNotFound
	}
	return holdFromMap(id, m)
}

// Expired implements reservation.Holds.
func (s *Store) Expired(ctx context.Context, sku string, t time.Time, limit int) ([]reservation.Reservation, error) {
	k := keysOf(sku)
	ids, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: k.exp(), Start: "-inf", Stop: strconv.FormatInt(ms(t), 10), ByScore: true, Count: int64(limit),
	}).Result()
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
		h, err := holdFromMap(id, m)
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
func (s *Store) Stock(ctx context.Context, sku string) (int64, int64, error) {
	k := keysOf(sku)
	var stock *redis.StringCmd
	var held *redis.StringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		stock = p.Get(ctx, k.stock())
		held = p.HGet(ctx, k.meta(), "held")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, reservation.Unavailable("redis stock", err)
	}
	available, err := stock.Int64()
	if errors.Is(err, redis.Nil) {
		return 0, 0, reservation.ErrUnknownSKU
	}
	if err != nil {
		return 0, 0, fmt.Errorf("redis stock %s: %w", sku, err)
	}
	h, err := held.Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("redis held %s: %w", sku, err)
	}
	return available, h, nil
}

// Warm implements reservation.Holds.
func (s *Store) Warm(ctx context.Context, level reservation.StockLevel) (bool, error) {
	return s.stock(ctx, "warm", level, 0)
}

// AdjustStock implements reservation.Holds.
func (s *Store) AdjustStock(ctx context.Context, level reservation.StockLevel, delta int64) error {
	_, err := s.stock(ctx, "adjust", level, delta)
	return err
}

func (s *Store) stock(ctx context.Context, mode string, level reservation.StockLevel, delta int64) (bool, error) {
	k := keysOf(level.SKU)
	n, err := stockScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()},
		mode, level.Available, level.Version, level.PerUserLimit, delta).Int()
	if err != nil {
		return false, reservation.Unavailable("redis "+mode, err)
	}
	return n == 1, nil
}

// Heal implements reservation.Holds.
func (s *Store) Heal(ctx context.Context, sku string, seenAvailable, seenHeld, drift int64, now time.Time, after time.Duration) (bool, error) {
	k := keysOf(sku)
	n, err := healScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()},
		seenAvailable, seenHeld, drift, ms(now), after.Milliseconds()).Int()
	if err != nil {
		return false, reservation.Unavailable("redis heal", err)
	}
	return n == 1, nil
}

// CreateGroup implements reservation.Holds.
func (s *Store) CreateGroup(ctx context.Context, g reservation.Group) error {
	k := keysOf(g.SKU)
	err := groupCreateScript.Run(ctx, s.rdb, []string{k.group(g.ID)},
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
	g.Deadline = time.UnixMilli(d)
	return g, nil
}

// CloseGroup implements reservation.Holds.
func (s *Store) CloseGroup(ctx context.Context, g reservation.Group) ([]string, error) {
	k := keysOf(g.SKU)
	ids, err := groupCloseScript.Run(ctx, s.rdb, []string{k.group(g.ID), k.members(g.ID)}).StringSlice()
	if err != nil {
		return nil, reservation.Unavailable("redis close group", err)
	}
	return ids, nil
}

func holdFromPairs(id string, kv []string) (reservation.Reservation, error) {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return holdFromMap(id, m)
}

func holdFromMap(id string, m map[string]string) (reservation.Reservation, error) {
	qty, err := strconv.Atoi(m["qty"])
	if err != nil {
		return reservation.Reservation{}, fmt.Errorf("hold %s: bad qty %q", id, m["qty"])
	}
	deadline, _ := strconv.ParseInt(m["deadline"], 10, 64)
	created, _ := strconv.ParseInt(m["created"], 10, 64)
	r := reservation.Reservation{
		ID: id, SKU: m["sku"], Qty: qty, UserID: m["user"], GroupID: m["group"],
		Status: reservation.Status(m["state"]), Reason: reservation.Reason(m["reason"]),
		Refunded: m["refunded"] == "1",
	}
	if deadline > 0 {
		r.ExpiresAt = time.UnixMilli(deadline).UTC()
	}
	if created > 0 {
		r.CreatedAt = time.UnixMilli(created).UTC()
	}
	return r, nil
}
