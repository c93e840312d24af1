package redisstore

// The key layout: keys names every key of one bucket of a SKU under its
// hash tag, keysOf and keysOfHold pick the bucket, and sweepKeys names the
// sweeper's keys of one ledger. No other code (and no script) builds a key
// name.

import "github.com/holdfast/holdfast/shared/reservation"

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
func (k keys) ahead() string             { return k.tag + ":ahead" }
func (k keys) users() string             { return k.tag + ":users" }
func (k keys) hold(id string) string     { return k.tag + ":r:" + id }
func (k keys) group(gid string) string   { return k.tag + ":g:" + gid }
func (k keys) members(gid string) string { return k.tag + ":gm:" + gid }

// unpaid names the hash of the bucket's CONFIRMED reservations still
// unpaid within a pay window (id -> qty): units that may return.
func (k keys) unpaid() string { return k.tag + ":unpaid" }

// attempts names a user's attempt budget (budget.lua): one string,
// "tokens:at:last". It was a hash under ":rl:" (from when it was named a
// rate limit); a string read there by the old scripts' HMGET would be
// WRONGTYPE while old and new code run side by side during a deploy, so the
// string has a name of its own (ab: attempt budget). Budgets reset once, at
// that deploy: every buyer starts with a full burst (and may spend one in
// each name while both codes run); the old hashes expire when full again.
func (k keys) attempts(user string) string { return k.tag + ":ab:" + user }
func (k keys) opened(user string) string   { return k.tag + ":og:" + user }

// The waiting room's keys (queue.lua), in bucket 0 of its SKU.
func (k keys) queue() string    { return k.tag + ":q" }
func (k keys) qmeta() string    { return k.tag + ":qm" }
func (k keys) admitted() string { return k.tag + ":qa" }
func (k keys) done() string     { return k.tag + ":qd" }

// queueKeys are queue.lua's KEYS but the last (the charged buyer's
// attempts).
func (k keys) queueKeys() []string {
	return []string{k.stock(), k.meta(), k.queue(), k.qmeta(), k.admitted(), k.done()}
}

func (k keys) holdKeys(r reservation.Reservation) []string {
	// The group keys are placeholders (never written) when there is no group.
	return []string{k.stock(), k.meta(), k.exp(), k.users(), k.hold(r.ID), k.group(r.GroupID), k.members(r.GroupID)}
}

// followKeys are follow.lua's KEYS: holdKeys, then the group and members
// hashes of elsewhere, the group of a stray held in another group than
// r's (placeholders, never written, when elsewhere is ""), then unpaid.
func (k keys) followKeys(r reservation.Reservation, elsewhere string) []string {
	return append(k.holdKeys(r), k.group(elsewhere), k.members(elsewhere), k.unpaid())
}

// sweepKeys names the sweeper's keys of one ledger. Their hash tag starts
// with '#', which no SKU may contain, so it never names a SKU's slot.
type sweepKeys struct{ tag string }

func sweepKeysOf(ledger string) sweepKeys { return sweepKeys{tag: "hf:{#sweep:" + ledger + "}"} }

func (k sweepKeys) live() string   { return k.tag + ":live" }
func (k sweepKeys) cursor() string { return k.tag + ":cursor" }
