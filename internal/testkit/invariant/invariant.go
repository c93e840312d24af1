// Package invariant checks holdfast's invariants (docs/design.md, I1–I5)
// on the real stores. Every fault test, the chaos test and the load test's
// end-to-end check use this one checker.
package invariant

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/holdfast/holdfast/internal/testkit/outbox"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Stock is what the checker needs of Redis: a SKU's available and held units.
type Stock interface {
	Stock(ctx context.Context, sku string) (reservation.RedisStock, error)
}

// Expect is what the test knows: the units it made sellable per SKU, the
// reservations that were accepted, and whether the system has settled.
type Expect struct {
	Sellable  map[string]int64 // every unit ever made sellable, per SKU
	Accepted  []string         // reservation ids answered 202
	Quiescent bool             // everything decided: I2 and I4 apply
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string // I1 … I5
	Detail    string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// Violations formats a list for a test failure.
func Violations(vs []Violation) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = v.String()
	}
	return strings.Join(s, "\n")
}

// Check reads MySQL (db) and Redis (stock) and returns every violation.
//
//   - I1 no oversell: MySQL available ≥ 0, and available + confirmed units =
//     units made sellable (the ledger balances: nothing taken twice or lost).
//   - I2 conservation (quiescent): Redis available = MySQL available, no hold
//     left, no cancellation Redis has not followed (the release outbox is empty);
//     for a SKU over K buckets, each bucket's Redis figure is its MySQL share
//     (and so their sum is MySQL's available).
//
// A transfer's row (into_bucket set) moves units between buckets and takes
// none: it is not a confirmed reservation here.
//   - I3 at most once: no reservation id is confirmed twice; with I1 and I2,
//     each id took stock once per store.
//   - I4 termination (quiescent): every accepted id has a final row, and
//     each of its transitions its event in the outbox, published.
//   - I5 groups (of the SKUs in Expect.Sellable): members ≤ capacity, members =
//     confirmed members, one join per user, a FAILED group keeps no confirmed member.
//   - I6 per-user limits: for a SKU with a per_user_limit, the count persist
//     checks the limit against (user_units) is each user's CONFIRMED units,
//     so a confirm past the limit in effect is refused. (Lowering a limit
//     cancels nothing already confirmed, so "units ≤ limit" is the tests'
//     to check where they know the limit did not drop.)
func Check(ctx context.Context, db *sql.DB, redis Stock, e Expect) ([]Violation, error) {
	var out []Violation
	add := func(inv, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)})
	}
	skus := make([]string, 0, len(e.Sellable))
	for sku := range e.Sellable {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		var available, confirmed int64
		var buckets int
		if err := db.QueryRowContext(ctx, `SELECT available, buckets FROM product_stock WHERE sku = ?`, sku).Scan(&available, &buckets); err != nil {
			return nil, fmt.Errorf("invariant: stock of %s: %w", sku, err)
		}
		var sum sql.NullInt64
		if err := db.QueryRowContext(ctx, `SELECT SUM(qty) FROM reservations WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NULL`, sku).Scan(&sum); err != nil {
			return nil, err
		}
		confirmed = sum.Int64
		if available < 0 {
			add("I1", "%s: MySQL available %d < 0", sku, available)
		}
		if available+confirmed != e.Sellable[sku] {
			add("I1", "%s: MySQL available %d + confirmed %d != sellable %d", sku, available, confirmed, e.Sellable[sku])
		}
		if e.Quiescent {
			shares := map[int]int64{0: available}
			rows, err := db.QueryContext(ctx, `SELECT bucket, available FROM stock_buckets WHERE sku = ?`, sku)
			if err != nil {
				return nil, err
			}
			for rows.Next() {
				var b int
				var n int64
				if err := rows.Scan(&b, &n); err != nil {
					rows.Close()
					return nil, err
				}
				if b < 1 || b >= max(buckets, 1) {
					add("I2", "%s: a share of %d units for bucket %d, which the SKU (%d buckets) does not have", sku, n, b, buckets)
					continue
				}
				shares[b] += n
				shares[0] -= n
			}
			rows.Close()
			var redisSum int64
			for b := range max(buckets, 1) {
				name := reservation.BucketName(sku, b)
				rs, err := redis.Stock(ctx, name)
				if err != nil {
					return nil, fmt.Errorf("invariant: redis stock of %s: %w", name, err)
				}
				redisSum += rs.Available
				if rs.Available != shares[b] || rs.Held != 0 {
					add("I2", "%s: Redis available %d held %d, MySQL's share %d", name, rs.Available, rs.Held, shares[b])
				}
			}
			if redisSum != available {
				add("I2", "%s: Redis available %d over %d buckets, MySQL available %d", sku, redisSum, buckets, available)
			}
			var unreleased int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM reservations WHERE sku = ? AND released = 0`, sku).Scan(&unreleased); err != nil {
				return nil, err
			}
			if unreleased != 0 {
				add("I2", "%s: %d cancellations Redis has not followed", sku, unreleased)
			}
		}
		var limit int
		if err := db.QueryRowContext(ctx, `SELECT per_user_limit FROM product_stock WHERE sku = ?`, sku).Scan(&limit); err != nil {
			return nil, err
		}
		if limit > 0 {
			var user sql.NullString
			var counted, confirmed sql.NullInt64
			err := db.QueryRowContext(ctx, `SELECT c.user_id, u.units, c.units FROM
				(SELECT user_id, SUM(qty) AS units FROM reservations WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NULL GROUP BY user_id) c
				LEFT JOIN user_units u ON u.sku = ? AND u.user_id = c.user_id
				WHERE u.units IS NULL OR u.units <> c.units LIMIT 1`, sku, sku).Scan(&user, &counted, &confirmed)
			if err != nil && err != sql.ErrNoRows {
				return nil, err
			}
			if err == nil {
				add("I6", "%s: user %s has %d confirmed units, the limit's count says %d", sku, user.String, confirmed.Int64, counted.Int64)
			}
		}
	}

	var dup int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) - COUNT(DISTINCT reservation_id) FROM reservations`).Scan(&dup); err != nil {
		return nil, err
	}
	if dup != 0 {
		add("I3", "%d reservation ids have more than one row", dup)
	}

	if e.Quiescent {
		for _, id := range e.Accepted {
			var status string
			var refunded, paid bool
			err := db.QueryRowContext(ctx, `SELECT status, refunded, paid_at IS NOT NULL FROM reservations WHERE reservation_id = ?`, id).Scan(&status, &refunded, &paid)
			switch {
			case err == sql.ErrNoRows:
				add("I4", "accepted %s has no decision", id)
			case err != nil:
				return nil, err
			}
			if err != nil {
				continue
			}
			// The row's transitions, each with its event, all published.
			want := map[int]string{1: "ReservationConfirmed"}
			switch {
			case status == "CONFIRMED" && paid:
				want[2] = "ReservationPaid"
			case status == "CANCELLED" && refunded:
				want[2] = "ReservationCancelled"
			case status == "CANCELLED":
				want[1] = "ReservationCancelled"
			}
			rows, err := db.QueryContext(ctx, `SELECT version, type, published FROM `+outbox.Table+` WHERE aggregate_id = ? AND event_id LIKE 'reservation/%'`, id)
			if err != nil {
				return nil, err
			}
			got := map[int]string{}
			for rows.Next() {
				var v int
				var typ string
				var published bool
				if err := rows.Scan(&v, &typ, &published); err != nil {
					_ = rows.Close()
					return nil, err
				}
				got[v] = typ
				if !published {
					add("I4", "%s: its %s (version %d) did not go out", id, typ, v)
				}
			}
			_ = rows.Close()
			if len(got) != len(want) || got[1] != want[1] || got[2] != want[2] {
				add("I4", "%s (%s, refunded %v, paid %v): events %v, want %v", id, status, refunded, paid, got, want)
			}
		}
	}

	if len(skus) == 0 {
		return out, nil
	}
	args := make([]any, len(skus))
	for i, sku := range skus {
		args[i] = sku
	}
	rows, err := db.QueryContext(ctx, `SELECT g.group_id, g.capacity, g.members, g.status,
		(SELECT COUNT(*) FROM reservations r WHERE r.group_id = g.group_id AND r.status = 'CONFIRMED'),
		(SELECT COUNT(DISTINCT r.user_id) FROM reservations r WHERE r.group_id = g.group_id AND r.status = 'CONFIRMED'),
		(SELECT COUNT(*) FROM group_members m WHERE m.group_id = g.group_id)
		FROM group_buys g WHERE g.sku IN (?`+strings.Repeat(",?", len(skus)-1)+`)`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, status string
		var capacity, members, confirmed, users, memberRows int
		if err := rows.Scan(&id, &capacity, &members, &status, &confirmed, &users, &memberRows); err != nil {
			return nil, err
		}
		switch {
		case members > capacity:
			add("I5", "group %s: %d members for %d slots", id, members, capacity)
		case members != confirmed || memberRows != confirmed:
			add("I5", "group %s: members %d, member rows %d, confirmed reservations %d", id, members, memberRows, confirmed)
		case users != confirmed:
			add("I5", "group %s: %d confirmed joins from %d users", id, confirmed, users)
		case e.Quiescent && status == "FAILED" && confirmed != 0:
			add("I5", "group %s FAILED but keeps %d confirmed members", id, confirmed)
		}
	}
	return out, rows.Err()
}
