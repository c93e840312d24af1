package redisstore

// The Lua scripts: each lua/*.lua embedded once and wrapped once in a
// *redis.Script (a prelude such as clock.lua or budget.lua concatenated in
// front of the scripts that need it), reserve.lua's KEYS and ARGV for tools
// that run it raw, and pipeline, which sends a batch of EVALSHAs and loads a
// script Redis does not have yet.

import (
	"context"
	_ "embed"
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
	//go:embed lua/landed.lua
	landedLua string
	//go:embed lua/charge.lua
	chargeLua string
	//go:embed lua/budget.lua
	budgetLua string
	//go:embed lua/group_accept.lua
	groupAcceptLua string
	//go:embed lua/queue.lua
	queueLua string
)

// ReserveLua is the reserve script's source (with its clock and budget preludes), for
// tools that measure the raw script (make bench's floor); ReserveKeys and
// ReserveArgs give its KEYS and ARGV.
var ReserveLua = clockLua + budgetLua + reserveLua

// ReserveKeys returns the KEYS of reserve.lua for a reservation.
func ReserveKeys(r reservation.Reservation) []string {
	k := keysOfHold(r)
	return append(k.holdKeys(r), k.attempts(r.UserID), k.admitted(), k.done())
}

// ReserveArgs returns the ARGV of reserve.lua for a reservation, reading the
// time from Redis as production does, with rate and burst as the per-user
// attempt defaults and no retention (the reply's whole is "0").
func ReserveArgs(r reservation.Reservation, ttl time.Duration, rate, burst int) []any {
	return []any{r.SKU, r.ID, r.Qty, r.UserID, r.GroupID, ttl.Milliseconds(), r.Token, "", rate, burst, "0", r.Ticket, r.TicketExpires.UnixMilli(), 0}
}

var (
	reserveScript     = redis.NewScript(ReserveLua)
	followScript      = redis.NewScript(clockLua + followLua)
	expiredScript     = redis.NewScript(clockLua + expiredLua)
	stockScript       = redis.NewScript(stockLua)
	warmScript        = redis.NewScript(clockLua + warmLua)
	groupCreateScript = redis.NewScript(groupCreateLua)
	groupCloseScript  = redis.NewScript(clockLua + groupCloseLua)
	groupFormScript   = redis.NewScript(groupFormLua)
	groupAcceptScript = redis.NewScript(groupAcceptLua)
	healScript        = redis.NewScript(clockLua + healLua)
	confirmScript     = redis.NewScript(clockLua + confirmLua)
	touchScript       = redis.NewScript(clockLua + touchLua)
	unmarkScript      = redis.NewScript(clockLua + unmarkLua)
	takeoutScript     = redis.NewScript(clockLua + takeoutLua)
	creditScript      = redis.NewScript(clockLua + creditLua)
	landedScript      = redis.NewScript(landedLua)
	chargeScript      = redis.NewScript(clockLua + budgetLua + chargeLua)
	queueScript       = redis.NewScript(clockLua + budgetLua + queueLua)
)

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
