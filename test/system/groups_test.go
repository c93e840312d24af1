package system_test

// What a group promises: it never exceeds capacity; one whose slots were all
// taken in time, by joins told 202, forms and stays formed whatever fails
// around its last join; a join never accepted never forms it; a failed group
// returns all its stock; no buyer can delay the end of anybody else's group.
// Each test drives the real stack through the API, the consumers and the
// sweeper.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// newPromiseDBProxy is a promise stack with a fault proxy in front of MariaDB.
func newPromiseDBProxy(t *testing.T) (*promise, *faultproxy.Proxy) {
	t.Helper()
	var db *faultproxy.Proxy
	p := newPromise(t, withDBProxy(&db))
	return p, db
}

// fillWithoutRecord opens a group of two and fills it: u1 joins, then u2's
// join takes the last slot while MySQL refuses connections, so the join is
// accepted (202: its message is sent) but recording FORMED fails — as when
// MySQL blips, or the reserve dies after its send.
func fillWithoutRecord(t *testing.T, p *promise, db *faultproxy.Proxy, sku string) (gid, m1, m2 string) {
	t.Helper()
	p.createSKU(sku, 10, 0)
	gid = p.group(sku, 2, 30)
	m1 = p.joined(sku, gid, "u1")
	db.Refuse(true)
	m2 = p.joined(sku, gid, "u2")
	db.Refuse(false)
	if st, _, _ := p.groupState(gid); st != "OPEN" {
		t.Fatalf("after the last join with MySQL refusing: the group is %s in MySQL, want OPEN (its record failed)", st)
	}
	return gid, m1, m2
}

// redisGroup reads a group's hash in Redis.
func (p *promise) redisGroup(sku, gid string) map[string]string {
	p.t.Helper()
	m, err := p.rdb.HGetAll(context.Background(), "hf:{"+sku+"}:g:"+gid).Result()
	if err != nil {
		p.t.Fatalf("redis group %s: %v", gid, err)
	}
	return m
}

// wantFormed requires the group FORMED in MySQL, in Redis and through the API.
func (p *promise) wantFormed(step, sku, gid string) {
	p.t.Helper()
	if st, _, _ := p.groupState(gid); st != "FORMED" {
		p.t.Fatalf("%s: group is %s in MySQL, want FORMED", step, st)
	}
	if rg := p.redisGroup(sku, gid); rg["status"] != "FORMED" || rg["remaining"] != "0" {
		p.t.Fatalf("%s: group in Redis = %v, want FORMED with remaining 0", step, rg)
	}
	if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["status"] != "FORMED" || g["remaining"] != float64(0) {
		p.t.Fatalf("%s: GET /groups/%s = %d %v, want FORMED with remaining 0", step, gid, code, g)
	}
}

// noGroupFailed requires that no reservation of the SKU was cancelled
// group_failed and that the sweeper failed no group.
func (p *promise) noGroupFailed(step, sku string, rep reservation.SweepReport) {
	p.t.Helper()
	if n := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'group_failed'`, sku); n != 0 || rep.GroupsFailed != 0 {
		p.t.Fatalf("%s: %d reservations cancelled group_failed, %d groups failed; want none (the group filled in time)", step, n, rep.GroupsFailed)
	}
}

// persistQuiet delivers the captured message of id to persist without
// failing the test (it may run on another goroutine).
func (p *promise) persistQuiet(id string) error {
	body, err := message.Encode(p.msg(id))
	if err != nil {
		return err
	}
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: fmt.Sprintf("q-%d", time.Now().UnixNano()),
		Body: string(body), EventSource: "aws:sqs", EventSourceARN: p.queues.ARN}}}
	resp, err := p.persist.Handle(context.Background(), ev)
	if err == nil && len(resp.BatchItemFailures) > 0 {
		err = fmt.Errorf("%d records failed", len(resp.BatchItemFailures))
	}
	return err
}

// body2id finds user's reservation id of the test's SKU from MySQL.
func body2id(p *promise, user string) string {
	var id string
	_ = p.db.QueryRow(`SELECT reservation_id FROM reservations WHERE user_id = ? ORDER BY created_at DESC LIMIT 1`, user).Scan(&id)
	return id
}

// afterSendEnqueuer records the message (the send succeeds) and then runs
// after once, if set: a fault that strikes between the send and the mark.
type afterSendEnqueuer struct {
	rec   *recordingEnqueuer
	after atomic.Pointer[func()]
}

func (e *afterSendEnqueuer) Enqueue(ctx context.Context, r reservation.Reservation) error {
	err := e.rec.Enqueue(ctx, r)
	if f := e.after.Swap(nil); f != nil {
		(*f)()
	}
	return err
}

// failUsers records every message like recordingEnqueuer, except those of
// the listed users, whose send fails (an SQS outage for that one request).
type failUsers struct {
	next  *recordingEnqueuer
	users map[string]bool
}

func (f failUsers) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if f.users[r.UserID] {
		return reservation.Unavailable("sqs send", errors.New("injected: connection reset"))
	}
	return f.next.Enqueue(ctx, r)
}

// TestGroups: groups form when filled in time, never otherwise, and fail
// returning all their stock.
func TestGroups(t *testing.T) {
	// A 3-slot group with 10 concurrent joiners, two of them the same user: 3
	// members, no user twice, in Redis and then in MySQL.
	t.Run("a group of three takes three distinct joiners", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("grp")
		s.setStock(sku, 100)
		code, g := s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":3,"ttl_seconds":600}`, nil)
		if code != http.StatusCreated || g["status"] != "OPEN" {
			t.Fatalf("create group = %d %v", code, g)
		}
		gid := g["group_id"].(string)
		users := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u0"}
		type result struct {
			code int
			body map[string]any
		}
		results := make([]result, len(users))
		var wg sync.WaitGroup
		for i, u := range users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, b := s.join(sku, gid, u)
				results[i] = result{c, b}
			}()
		}
		wg.Wait()
		joined := map[string]int{}
		for i, r := range results {
			switch {
			case r.code == http.StatusAccepted:
				joined[users[i]]++
			case r.code == http.StatusConflict && (r.body["error"] == "group_full" || r.body["error"] == "already_joined"):
			default:
				t.Errorf("join %s = %d %v", users[i], r.code, r.body)
			}
		}
		if len(joined) != 3 {
			t.Fatalf("joined = %v, want 3 distinct users", joined)
		}
		for u, n := range joined {
			if n != 1 {
				t.Errorf("user %s joined %d times", u, n)
			}
		}
		if avail, _ := s.redisStock(sku); avail != 97 {
			t.Errorf("redis available = %d, want 97", avail)
		}
		stop := s.runPersist(2)
		testservices.Eventually(t, 30*time.Second, "group formed in MySQL", func() bool {
			return s.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND status = 'FORMED' AND members = 3`, gid) == 1
		})
		stop()
		if n := s.count(`SELECT COUNT(DISTINCT user_id) FROM group_members WHERE group_id = ?`, gid); n != 3 {
			t.Errorf("mysql members = %d, want 3", n)
		}
		if got := s.mysqlAvailable(sku); got != 97 {
			t.Errorf("mysql available = %d, want 97", got)
		}
		if code, body := s.call("GET", "/groups/"+gid, "", nil); code != 200 || body["status"] != "FORMED" || body["remaining"] != float64(0) {
			t.Errorf("GET group = %d %v, want FORMED with 0 remaining", code, body)
		}
		if code, body := s.join(sku, gid, "late"); code != http.StatusConflict {
			t.Errorf("join after formed = %d %v, want 409", code, body)
		}
	})

	// An unfilled group past its deadline fails and returns all its stock to
	// Redis and MySQL: confirmed members are refunded, held ones released.
	t.Run("an unfilled group fails at its deadline and returns all its stock", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("gfail")
		s.setStock(sku, 10)
		_, g := s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":3,"ttl_seconds":30}`, nil)
		gid := g["group_id"].(string)
		for _, u := range []string{"a", "b"} {
			if code, body := s.join(sku, gid, u); code != http.StatusAccepted {
				t.Fatalf("join %s = %d %v", u, code, body)
			}
		}
		// One member is confirmed in MySQL, the other's message is still in flight.
		if _, err := s.app.Service.Persist(context.Background(), rec.msgs[0]); err != nil {
			t.Fatal(err)
		}
		if got := s.mysqlAvailable(sku); got != 9 {
			t.Fatalf("mysql available = %d, want 9", got)
		}
		s.clock.Advance(29 * time.Second) // before the group's deadline (30 s)
		if rep := s.sweep(); rep.GroupsFailed != 0 {
			t.Fatalf("failed a group before its deadline")
		}
		s.clock.Advance(2 * time.Second) // past it (by Redis's clock too), not the holds' (60 s)
		if rep := s.sweep(); rep.GroupsFailed != 1 {
			t.Fatalf("sweep failed %d groups, want 1", rep.GroupsFailed)
		}
		// The in-flight message arrives late: it takes nothing.
		out, err := s.app.Service.Persist(context.Background(), rec.msgs[1])
		if err != nil || out.Status != reservation.StatusCancelled {
			t.Fatalf("late persist = %v %v, want CANCELLED", out.Status, err)
		}
		if got := s.mysqlAvailable(sku); got != 10 {
			t.Errorf("mysql available = %d, want 10", got)
		}
		if avail, held := s.redisStock(sku); avail != 10 || held != 0 {
			t.Errorf("redis = %d/%d, want 10 available 0 held", avail, held)
		}
		if code, body := s.call("GET", "/groups/"+gid, "", nil); body["status"] != "FAILED" {
			t.Errorf("GET group = %d %v, want FAILED", code, body)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE group_id = ? AND status = 'CANCELLED' AND reason = 'group_failed'`, gid); n != 2 {
			rows, _ := s.db.Query(`SELECT reservation_id, status, IFNULL(reason,''), IFNULL(group_id,'') FROM reservations WHERE sku = ?`, sku)
			for rows.Next() {
				var a, b, c, d string
				_ = rows.Scan(&a, &b, &c, &d)
				t.Logf("row %s %s %s %s", a, b, c, d)
			}
			t.Errorf("cancelled members = %d, want 2", n)
		}
		if rep := s.sweep(); rep.GroupsFailed != 0 {
			t.Errorf("second sweep failed %d groups, want 0", rep.GroupsFailed)
		}
		if code, body := s.join(sku, gid, "c"); code != http.StatusConflict || body["error"] != "group_closed" {
			t.Errorf("join failed group = %d %v, want 409 group_closed", code, body)
		}
	})

	// A group whose slots were all taken before its deadline, by joins told 202,
	// is FORMED and stays FORMED in both stores, whoever records it and whatever
	// fails around its last join.
	t.Run("a group filled in time forms and stays formed", func(t *testing.T) {
		t.Run("a member's cancel before the deadline records it first", func(t *testing.T) {
			p, db := newPromiseDBProxy(t)
			sku := testservices.Name("gfcancel")
			gid, m1, m2 := fillWithoutRecord(t, p, db, sku)
			if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
				t.Fatalf("DELETE of member u1 = %d %v, want 200 CANCELLED", code, b)
			}
			p.wantFormed("after u1 left the filled group", sku, gid)
			if code, b := p.join(sku, gid, "u3"); code != http.StatusConflict || b["error"] != "group_full" {
				t.Fatalf("u3's join into the formed group = %d %v, want 409 group_full", code, b)
			}
			p.persistMsgs(m2)
			p.clock.Advance(40 * time.Second)
			rep := p.sweep()
			p.wantFormed("after the deadline", sku, gid)
			p.wantStatus(m2, reservation.StatusConfirmed, "")
			p.wantStatus(m1, reservation.StatusCancelled, reservation.ReasonBuyer)
			p.noGroupFailed("after the sweep", sku, rep)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
		})

		t.Run("persist's join records it and Redis learns it at once", func(t *testing.T) {
			p, db := newPromiseDBProxy(t)
			sku := testservices.Name("gfpersist")
			gid, m1, m2 := fillWithoutRecord(t, p, db, sku)
			p.persistMsgs(m1, m2)
			p.wantFormed("after persist settled both joins", sku, gid)
			if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND formed_at IS NOT NULL`, gid); n != 1 {
				t.Errorf("the group persist's join formed has no formed_at in MySQL")
			}
			// A member's refund after formation reopens no slot: no join is
			// accepted into a group the API calls FORMED.
			if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
				t.Fatalf("DELETE of member u1 = %d %v, want 200 CANCELLED", code, b)
			}
			if code, b := p.join(sku, gid, "u3"); code != http.StatusConflict || b["error"] != "group_full" {
				t.Fatalf("u3's join after a member of the FORMED group left = %d %v, want 409 group_full", code, b)
			}
			p.wantFormed("after u1's refund", sku, gid)
			p.clock.Advance(40 * time.Second)
			rep := p.sweep()
			p.noGroupFailed("after the sweep", sku, rep)
			p.wantStatus(m2, reservation.StatusConfirmed, "")
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
		})

		t.Run("the sweeper records it while persist is behind", func(t *testing.T) {
			p, db := newPromiseDBProxy(t)
			sku := testservices.Name("gflag")
			gid, m1, m2 := fillWithoutRecord(t, p, db, sku)
			p.clock.Advance(35 * time.Second) // past the deadline and the grace; the holds (60 s) not yet
			rep := p.sweep()
			p.wantFormed("at the deadline, nothing persisted", sku, gid)
			p.noGroupFailed("at the deadline", sku, rep)
			p.persistMsgs(m1, m2)
			p.wantStatus(m1, reservation.StatusConfirmed, "")
			p.wantStatus(m2, reservation.StatusConfirmed, "")
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
		})

		for _, persisted := range []bool{true, false} {
			name := "a member cancels after the deadline, before the sweep (held)"
			if persisted {
				name = "a member cancels after the deadline, before the sweep (confirmed)"
			}
			t.Run(name, func(t *testing.T) {
				p, db := newPromiseDBProxy(t)
				sku := testservices.Name("gfafter")
				gid, m1, m2 := fillWithoutRecord(t, p, db, sku)
				if persisted {
					p.persistMsgs(m1)
				}
				p.clock.Advance(35 * time.Second)
				if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
					t.Fatalf("DELETE of member u1 after the deadline = %d %v, want 200 CANCELLED", code, b)
				}
				rep := p.sweep()
				p.wantFormed("after the sweep", sku, gid)
				p.noGroupFailed("after the sweep", sku, rep)
				p.persistMsgs(m2)
				p.wantStatus(m2, reservation.StatusConfirmed, "")
				p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
			})
		}

		t.Run("a release after the deadline reopens no slot", func(t *testing.T) {
			// Redis decides the deadline as the group stood: a slot given back
			// after it (here a member fenced by the sweeper's hold expiry after a
			// refusal at MySQL's end) leaves the count as it was.
			p := newPromise(t)
			sku := testservices.Name("gfslot")
			p.createSKU(sku, 10, 0)
			gid := p.group(sku, 3, 30)
			m1 := p.joined(sku, gid, "u1")
			p.clock.Advance(31 * time.Second) // the deadline passed by Redis's clock; not yet swept (grace)
			if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
				t.Fatalf("DELETE of u1 = %d %v, want 200 CANCELLED", code, b)
			}
			if rg := p.redisGroup(sku, gid); rg["remaining"] != "2" {
				t.Fatalf("group in Redis after a release past its deadline = %v, want remaining 2 (as it stood at the deadline)", rg)
			}
			p.clock.Advance(5 * time.Second)
			p.sweep()
			if st, _, _ := p.groupState(gid); st != "FAILED" {
				t.Fatalf("unfilled group after the sweep is %s, want FAILED", st)
			}
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1}, Quiescent: true})
		})
	})

	// A group of two formed and both members were confirmed; after its deadline
	// one member cancels. Only that member is refunded: the group stays FORMED,
	// the other member stays CONFIRMED, and the sweeper fails nothing.
	t.Run("a refund after formation keeps the group formed", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("gref")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		m1, m2 := p.joined(sku, gid, "u1"), p.joined(sku, gid, "u2")
		p.persistMsgs(m1, m2)
		if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND status = 'FORMED'`, gid); n != 1 {
			t.Fatalf("group not FORMED in MySQL after both members persisted")
		}
		p.wantStores("formed", sku, 8, 0, 8)

		p.clock.Advance(40 * time.Second) // past the group's deadline and the sweep grace
		if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Fatalf("DELETE member 1 = %d %v, want 200 CANCELLED", code, b)
		}
		rep := p.sweep()
		if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["status"] != "FORMED" || g["remaining"] != float64(0) {
			t.Fatalf("GET /groups/%s = %d %v, want FORMED with remaining 0 (sweep failed %d groups)", gid, code, g, rep.GroupsFailed)
		}
		p.wantStatus(m2, reservation.StatusConfirmed, "")
		p.wantStatus(m1, reservation.StatusCancelled, reservation.ReasonBuyer)
		p.wantStores("member 1 refunded", sku, 9, 0, 9)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
	})

	// Both slots of a group are taken in Redis before its deadline, but one
	// member's message reaches persist only after deadline + grace and a sweep.
	// The group formed in time: it stays FORMED, and both members end CONFIRMED
	// with nothing refunded.
	t.Run("a group filled in time stays formed though persist lags", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("glag")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		m1, m2 := p.joined(sku, gid, "u1"), p.joined(sku, gid, "u2")
		if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["remaining"] != float64(0) || g["status"] != "FORMED" {
			t.Errorf("GET /groups/%s with every slot held = %d %v, want FORMED with remaining 0", gid, code, g)
		}
		p.persistMsgs(m1)

		p.clock.Advance(35 * time.Second) // deadline 30 s + grace 2 s passed; the holds (60 s) not yet
		if rep := p.sweep(); rep.GroupsFailed != 0 {
			t.Errorf("sweep failed %d groups, want 0: the group formed in Redis before its deadline", rep.GroupsFailed)
		}
		p.persistMsgs(m2)

		p.wantStatus(m1, reservation.StatusConfirmed, "")
		p.wantStatus(m2, reservation.StatusConfirmed, "")
		if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["status"] != "FORMED" || g["remaining"] != float64(0) {
			t.Fatalf("GET /groups/%s = %d %v, want FORMED with remaining 0", gid, code, g)
		}
		if n := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED'`, sku); n != 0 {
			t.Fatalf("%d reservations cancelled, want none", n)
		}
		p.wantStores("both members confirmed", sku, 8, 0, 8)
		p.clock.Advance(2 * time.Minute)
		p.sweep()
		p.wantStores("after a later sweep", sku, 8, 0, 8)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
	})

	// However many groups are due, one sweep ends them all — a buyer who keeps
	// thousands of empty groups due ahead of an honest one cannot delay it (or
	// the stock its members hold) past the next sweep.
	t.Run("one sweep ends every due group however many there are", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("gmany")
		p.createSKU(sku, 10, 0)
		spam := testservices.Name("gspam")
		p.createSKU(spam, 1, 0)
		const empty = 3000 // 6 pages of the default batch (500)
		ctx := context.Background()
		deadline := p.clock.Now().Add(10 * time.Second).Truncate(time.Millisecond)
		// The empty groups, due before the honest one, written as CreateGroup
		// writes them (their creation's metering is not what this test is about).
		for i := 0; i < empty; i += 500 {
			q := `INSERT INTO group_buys (group_id, sku, capacity, members, status, deadline, created_at, updated_at) VALUES `
			var args []any
			pipe := p.rdb.Pipeline()
			for j := i; j < min(i+500, empty); j++ {
				if j > i {
					q += ","
				}
				id := fmt.Sprintf("g-spam-%s-%05d", spam, j)
				q += "(?, ?, 2, 0, 'OPEN', ?, ?, ?)"
				args = append(args, id, spam, deadline.UTC(), p.clock.Now().UTC(), p.clock.Now().UTC())
				pipe.HSet(ctx, "hf:{"+spam+"}:g:"+id, "capacity", 2, "remaining", 2, "status", "OPEN", "deadline", deadline.UnixMilli())
				pipe.PExpire(ctx, "hf:{"+spam+"}:g:"+id, time.Hour)
			}
			if _, err := p.db.ExecContext(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		gid := p.group(sku, 3, 20) // due after every empty group
		m1 := p.joined(sku, gid, "u1")
		p.wantStores("u1 holds a unit in the honest group", sku, 9, 1, 10)
		p.clock.Advance(25 * time.Second) // past both deadlines and the grace
		rep := p.sweep()
		if st, _, _ := p.groupState(gid); st != "FAILED" {
			t.Fatalf("after one sweep with %d empty groups due first: the honest group is %s, want FAILED (ended in this sweep); report %+v", empty, st, rep)
		}
		p.wantStatus(m1, reservation.StatusCancelled, reservation.ReasonGroupFailed)
		p.wantStores("the honest group's stock returned", sku, 10, 0, 10)
		if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE sku = ? AND status = 'OPEN'`, spam); n != 0 {
			t.Fatalf("%d empty groups still OPEN after the sweep, want 0", n)
		}
	})

	// POST /groups with ttl_seconds 18446744074 (about 585 years) is refused
	// (400: at most 604800) and creates no group.
	//
	// Found by the first review, of issue 9's first part (was
	// TestReviewGroupTTLOverflowIsRefused): the handler multiplied by
	// time.Second in int64, which wrapped to 0.29 s; the range check passed and
	// a group was created that closed at once.
	t.Run("a group ttl past the maximum is refused and creates nothing", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("rvttl")
		p.createSKU(sku, 10, 0)
		code, g := p.call("POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":2,"ttl_seconds":18446744074}`, sku), nil)
		if code != http.StatusBadRequest {
			t.Errorf("POST /groups with ttl_seconds 18446744074 = %d %v, want 400 invalid_request", code, g)
		}
		if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE sku = ?`, sku); n != 0 {
			t.Errorf("bad input created %d group(s)", n)
		}
	})

	// A join answered 503 (its send failed; the reservation is fenced
	// publish_failed and nothing is held) gives its slot back: it never forms
	// the group, the next joiner is accepted, and a group not filled by accepted
	// joins fails at its deadline and returns its stock.
	//
	// Found by the second review, of issue 9 (was
	// TestReview2FailedJoinDoesNotFormGroup), which saw this:
	//
	// A join that is answered 503 (its SQS send failed, the reservation is
	// fenced CANCELLED publish_failed and "nothing is held") still forms the
	// group when it took the last slot.
	//
	//  1. group of 2; u1 joins (202);
	//  2. u2 joins, reserve.lua takes the last slot (FORMED in Redis, FormGroup
	//     records FORMED in MySQL), the send fails, the hold is fenced and
	//     released — but follow.lua returns the slot only to an OPEN group;
	//  3. u3 now gets 409 group_full; at the deadline the group stays FORMED
	//     with 1 member of 2 and never fails.
	//
	// Promised: a 503 holds nothing, a group forms only when its capacity is
	// reached, an unfilled group fails and returns all its stock. Observed: a
	// group "formed" by a join that never happened, with a slot nobody can take.
	t.Run("a join answered 503 frees its slot and does not form the group", func(t *testing.T) {
		p := &promise{rec: &recordingEnqueuer{}}
		p.stack = newStack(t, withEnqueuer(failUsers{next: p.rec, users: map[string]bool{"u2": true}}))
		sku := testservices.Name("r2form")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		m1 := p.joined(sku, gid, "u1")
		if code, b := p.join(sku, gid, "u2"); code != http.StatusServiceUnavailable {
			t.Fatalf("join of u2 with a failing send = %d %v, want 503", code, b)
		}
		_, g := p.call("GET", "/groups/"+gid, "", nil)
		code, b := p.join(sku, gid, "u3")
		accepted := []string{m1}
		if code == http.StatusAccepted {
			accepted = append(accepted, b["reservation_id"].(string))
		}
		p.persistMsgs(accepted...)
		p.clock.Advance(40 * time.Second)
		p.sweep()
		st, members, capacity := p.groupState(gid)
		if code != http.StatusAccepted || (st == "FORMED" && members < capacity) {
			t.Errorf("after u2's join failed (503): GET /groups = %v; u3's join = %d %v; at the deadline the group is %s with %d of %d members — "+
				"want the failed join to free its slot (u3 202) and a group FORMED only when full (or FAILED with its stock returned)",
				g, code, b, st, members, capacity)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: true})
	})

	// A member's release before formation reopens the slot, even when Redis
	// follows the refund late (the release waits in the outbox): the group forms
	// only when its last slot is taken, and a cancelled member never fills it.
	//
	// Found by the second review, of issue 9 (was
	// TestReview2ReleaseBeforeFormationReopensTheSlot), which saw this:
	//
	// A member cancels before the group formed, but Redis follows the refund
	// late (a Redis blip during the DELETE: the release waits in the outbox for
	// the sweeper).
	//
	//  1. group of 2; u1 joins and is confirmed (MySQL members 1, OPEN);
	//  2. u1's DELETE refunds in MySQL (members 0) while Redis is unreachable: 200;
	//  3. before the next sweep, u2 joins: Redis still counts u1's slot, so u2's
	//     join takes the "last" slot: FORMED in Redis and in MySQL (members 0);
	//  4. the sweeper drains the release: the group is FORMED, the slot stays taken.
	//
	// Promised (design.md, Groups): before formation a released or refunded
	// member's slot reopens; the group forms when its last slot is taken.
	// Observed: the group is FORMED for good with 1 member of 2 — formed by a
	// member who had cancelled before it formed — and no one can join.
	t.Run("a release before formation reopens the slot though Redis follows it late", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("r2pend")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 60)
		m1 := p.joined(sku, gid, "u1")
		p.persistMsgs(m1)

		p.proxy.Refuse(true)
		code, b := p.call("DELETE", "/reservations/"+m1, "", nil)
		p.proxy.Refuse(false)
		if code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Fatalf("DELETE of u1 with Redis down = %d %v, want 200 CANCELLED (MySQL refunded)", code, b)
		}
		m2 := p.joined(sku, gid, "u2") // u1 cancelled: u2 is the group's only member
		p.persistMsgs(m2)
		p.clock.Advance(5 * time.Second)
		p.sweep() // the release reaches Redis

		_, g := p.call("GET", "/groups/"+gid, "", nil)
		code3, b3 := p.join(sku, gid, "u3")
		accepted := []string{m1, m2}
		if code3 == http.StatusAccepted {
			accepted = append(accepted, b3["reservation_id"].(string))
			p.persistMsgs(b3["reservation_id"].(string))
		}
		st, members, capacity := p.groupState(gid)
		if st == "FORMED" && members < capacity && code3 != http.StatusAccepted {
			t.Errorf("u1 cancelled before anyone else joined, then u2 joined: MySQL group %s with %d of %d members, GET /groups = %v, "+
				"u3's join = %d %v; want the group OPEN with one free slot (u3 202)", st, members, capacity, g, code3, b3)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: false})
	})

	// An unkeyed join takes the last slot but its Redis reply is lost: the buyer
	// hears 503 (never accepted). It is fenced hold_failed at once and its slot
	// reopens: it never formed the group.
	// Found by the adversarial review of issue 20 (was
	// TestGroupJoinWithLostReplyDoesNotFormIt).
	t.Run("a join whose reply is lost does not form the group", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("zjoin")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 300) // the deadline after the hold's (60 s)
		a := p.joined(sku, gid, "ua")
		p.persistMsgs(a)

		p.proxy.DropReplies(true)
		code, body := p.join(sku, gid, "ub")
		p.proxy.DropReplies(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("join with the reply lost = %d %v, want 503", code, body)
		}
		p.clock.Advance(65 * time.Second) // the lost hold's deadline + grace
		p.sweep()

		_, g := p.call("GET", "/groups/"+gid, "", nil)
		members := p.count(`SELECT members FROM group_buys WHERE group_id = ?`, gid)
		if g["status"] == "FORMED" {
			t.Errorf("GET /groups = %v with %d member(s): a group of 2 formed though only one join was told 202 (the other heard 503)", g, members)
		}
	})

	// An unkeyed join whose send fails is fenced publish_failed; Redis follows
	// it (the slot reopens) but the reply is lost, so the row stays released =
	// 0. The group then fills in time, every join told 202, and a member cancels
	// before the deadline. Recording FORMED first follows the group's unreleased
	// cancellations (a no-op here: Redis had applied it), so the record is not
	// blocked: the group forms, and the members who did nothing stay CONFIRMED.
	// Found by the adversarial review of issue 20 (was
	// TestGroupFormsThoughACancellationAwaitsItsAcknowledgement): the unreleased
	// row blocked the record, the cancel reopened a slot and the group failed.
	t.Run("a group filled in time forms though a cancellation awaits its acknowledgement", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromiseBehindProxy(t, withEnqueuer(enq))
		enq.rec = p.rec
		enq.before = func() { p.proxy.DropReplies(true) }
		sku := testservices.Name("zstale")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 3, 30)
		a := p.joined(sku, gid, "ua")

		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ud")
		enq.fail.Store(false)
		p.proxy.DropReplies(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("join whose send fails = %d %v, want 503", code, body)
		}
		if n := p.count(`SELECT COUNT(*) FROM reservations WHERE group_id = ? AND status = 'CANCELLED' AND released = 0`, gid); n != 1 {
			t.Fatalf("unreleased cancellations in the group = %d, want 1 (publish_failed, Redis followed, reply lost)", n)
		}

		b := p.joined(sku, gid, "ub")
		c := p.joined(sku, gid, "uc") // the last slot: every slot taken by joins told 202
		t.Logf("after the group filled: FORMED in MySQL = %d",
			p.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND status = 'FORMED'`, gid))

		p.clock.Advance(5 * time.Second)
		if code, body := p.call("DELETE", "/reservations/"+b, "", nil); code != http.StatusOK {
			t.Fatalf("DELETE %s = %d %v", b, code, body)
		}

		p.clock.Advance(35 * time.Second) // past the deadline + grace; holds (60 s) still HELD
		p.sweep()
		p.persistMsgs(a, c)
		p.sweep()

		_, g := p.call("GET", "/groups/"+gid, "", nil)
		sa, ra, _ := p.row(a)
		sc, rc, _ := p.row(c)
		if g["status"] != "FORMED" || sa != "CONFIRMED" || sc != "CONFIRMED" {
			t.Errorf("group filled in time by 202 joins (ua, ub, uc), ub cancelled before the deadline: group %v; ua %s %s, uc %s %s; want FORMED and both CONFIRMED",
				g["status"], sa, ra, sc, rc)
		}
	})

	// An unkeyed join takes a group's last slot 1 s before its deadline; its SQS
	// send fails after the retries, past the deadline. Its release gives the
	// slot back even after the deadline (the join never counted), so at the
	// deadline the group is not full: it fails and returns its stock.
	// Found by the second adversarial review of issue 20 (was
	// TestGroupJoinWhoseSendFailsPastTheDeadlineDoesNotFormIt): the slot stayed
	// taken and the group formed with 1 member of 2.
	t.Run("a join whose send fails past the deadline does not form the group", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromise(t, withEnqueuer(enq))
		enq.rec = p.rec
		sku := testservices.Name("zr2strad")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		a := p.joined(sku, gid, "ua")
		p.persistMsgs(a)

		p.clock.Advance(29 * time.Second)                        // 1 s before the deadline
		enq.before = func() { p.clock.Advance(2 * time.Second) } // the send's retries outlast the deadline
		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ub")
		enq.fail.Store(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("join whose send fails = %d %v, want 503", code, body)
		}
		p.clock.Advance(10 * time.Second)
		rep := p.sweep()
		st, members, capacity := p.groupState(gid)
		_, g := p.call("GET", "/groups/"+gid, "", nil)
		sa, ra, _ := p.row(a)
		if st == "FORMED" && members < capacity {
			t.Errorf("ub's join was answered 503 (publish_failed): after the deadline's sweep (%+v) the group is %s with %d of %d members (GET %v), ua %s %s; "+
				"want FAILED with ua refunded (only one accepted join)", rep, st, members, capacity, g, sa, ra)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{a}, Quiescent: true})
	})

	// An unkeyed join takes the last slot of a group of 2; its send fails and it
	// is fenced publish_failed, but Redis refuses the release (a blip): the
	// release waits in the outbox, past the deadline. Draining it gives the slot
	// back (the join never counted), so the group is not full at the sweep: it
	// fails and returns its stock.
	// Found by the second adversarial review of issue 20 (was
	// TestGroupJoinWhoseSendFailedAndWhoseReleaseWaitsDoesNotFormIt).
	t.Run("a join whose send failed and whose release waits does not form the group", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromiseBehindProxy(t, withEnqueuer(enq))
		enq.rec = p.rec
		sku := testservices.Name("zr2obx")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		a := p.joined(sku, gid, "ua")
		p.persistMsgs(a)

		p.clock.Advance(10 * time.Second)
		enq.before = func() { p.proxy.Refuse(true) } // Redis blips while reserve releases the failed join
		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ub")
		enq.fail.Store(false)
		p.proxy.Refuse(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("join whose send fails = %d %v, want 503", code, body)
		}
		code3, body3 := p.join(sku, gid, "uc")
		accepted := []string{a}
		if code3 == http.StatusAccepted {
			accepted = append(accepted, body3["reservation_id"].(string))
		}
		p.clock.Advance(25 * time.Second) // past the deadline; the next sweep runs now
		rep := p.sweep()
		st, members, capacity := p.groupState(gid)
		if st == "FORMED" && members < capacity {
			t.Errorf("ub answered 503 (publish_failed, release in the outbox); uc's join before the deadline = %d %v; "+
				"after the sweep (%+v) the group is %s with %d of %d members; want FAILED (stock returned) or uc accepted",
				code3, body3, rep, st, members, capacity)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: false})
	})

	// A join whose send is still in flight holds its slot but has not counted
	// yet: persist records no group FORMED on it, so when its send fails its
	// slot reopens and the next joiner is accepted.
	//
	// Found by the third adversarial review of issue 20 (was
	// TestGroupDoesNotFormWhilePersistMeetsAJoinInFlight), which saw this:
	//
	// Group of 2. ua joins (202). ux's unkeyed join takes the last slot; its SQS
	// send is slow and then fails (503, fenced publish_failed). While ux's send
	// is in flight, ua's message is persisted: persist's formGroup sees every
	// slot taken in Redis and records FORMED (MySQL, then Redis). ux's release
	// then meets a FORMED group and its slot never reopens. Expected (design.md
	// "Groups": a join that is never accepted ... its slot reopens: it never
	// formed the group): the group stays OPEN with one free slot; ub can join.
	// Observed: FORMED with 1 member of 2, ub refused group_full, ux's retry
	// refused already_joined though ux holds nothing.
	t.Run("persist does not form a group whose last join is in flight", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromise(t, withEnqueuer(enq))
		enq.rec = p.rec
		sku := testservices.Name("adv3a")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		a := p.joined(sku, gid, "ua")

		var perr error
		enq.before = func() { perr = p.persistQuiet(a) } // ua's message arrives while ux's send hangs
		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ux")
		enq.fail.Store(false)
		enq.before = nil
		if perr != nil {
			t.Fatalf("persist of ua: %v", perr)
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("ux's join whose send fails = %d %v, want 503", code, body)
		}
		st, members, capacity := p.groupState(gid)
		rg := p.redisGroup(sku, gid)
		_, g := p.call("GET", "/groups/"+gid, "", nil)
		t.Logf("after ux's 503: MySQL %s members %d/%d; Redis %v; GET /groups %v", st, members, capacity, rg, g)
		codeB, bodyB := p.join(sku, gid, "ub")
		codeX, bodyX := p.join(sku, gid, "ux")
		t.Logf("ub's join = %d %v; ux's retry = %d %v", codeB, bodyB, codeX, bodyX)
		if st != "OPEN" || codeB != http.StatusAccepted {
			t.Errorf("a group of 2 with one accepted join (ux was told 503 and fenced publish_failed) is %s in MySQL (members %d), Redis %v; ub's join %d %v — want OPEN with a free slot ub can take",
				st, members, rg, codeB, bodyB)
		}
		if codeX == http.StatusConflict && bodyX["error"] == "already_joined" {
			t.Errorf("ux, told 503 and holding nothing, is refused already_joined on retry")
		}
	})

	// No join is accepted into a group GET /groups calls FORMED, and no group is
	// recorded FORMED while a slot of it is free.
	//
	// Found by the third adversarial review of issue 20 (was
	// TestGroupCalledFormedAcceptsNoJoin), which saw this:
	//
	// Group of 2. ua joins (202). ux's unkeyed join takes the last slot and its
	// send hangs; ua's message is persisted meanwhile, and persist's formGroup
	// sees the group full in Redis (ux's slot). Before it writes FORMED, ux's
	// send fails: ux is fenced publish_failed and released (MySQL still OPEN, so
	// the slot reopens in Redis and the row is marked released). recordFormed
	// then finds no unreleased cancellation and records FORMED in MySQL; telling
	// Redis fails (a blip), so Redis stays OPEN with a free slot until a sweep.
	// ub's join is then accepted (202) into a group GET /groups calls FORMED.
	// Expected (design.md: "no join is accepted into a group GET /groups calls
	// FORMED"; a join never accepted never forms it): MySQL stays OPEN, or ub is
	// refused. Observed: ub 202 while GET /groups says FORMED, and the group was
	// recorded FORMED while it had a free slot.
	t.Run("a group called formed accepts no join", func(t *testing.T) {
		enq := &switchEnqueuer{}
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hooks := reservation.Hooks{RecordFormed: func(g reservation.Group) error {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release
			}
			return nil
		}}
		p := newPromiseBehindProxy(t, withEnqueuer(enq), withHooks(hooks))
		enq.rec = p.rec
		sku := testservices.Name("adv3b")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		a := p.joined(sku, gid, "ua")

		done := make(chan error, 1)
		enq.before = func() {
			go func() { done <- p.persistQuiet(a) }()
			<-entered // persist saw the group full (ux's slot) and is about to record it
		}
		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ux")
		enq.fail.Store(false)
		enq.before = nil
		if code != http.StatusServiceUnavailable {
			t.Fatalf("ux's join whose send fails = %d %v, want 503", code, body)
		}
		t.Logf("after ux's 503: Redis group %v", p.redisGroup(sku, gid))
		p.proxy.Refuse(true) // telling Redis FORMED fails (a blip): the outbox keeps it
		close(release)
		perr := <-done
		p.proxy.Refuse(false)
		t.Logf("persist of ua: %v", perr)

		st, members, _ := p.groupState(gid)
		t.Logf("MySQL group %s members %d; Redis group %v", st, members, p.redisGroup(sku, gid))
		_, g := p.call("GET", "/groups/"+gid, "", nil)
		codeB, bodyB := p.join(sku, gid, "ub")
		t.Logf("GET /groups = %v; then ub's join = %d %v", g, codeB, bodyB)
		if codeB == http.StatusAccepted && g["status"] == "FORMED" {
			t.Errorf("ub's join was accepted (202) into a group GET /groups called FORMED")
		}
		if codeB != http.StatusAccepted {
			t.Errorf("ub's join into a group with a free slot = %d %v, want 202", codeB, bodyB)
		}
		if st == "FORMED" && members < 2 {
			t.Errorf("group recorded FORMED with %d accepted member(s) of 2 while Redis had a free slot", members)
		}
	})

	// The sweeper records no group FORMED at its deadline on a join whose send
	// is still in flight: when that send fails, the group fails.
	//
	// Found by the third adversarial review of issue 20 (was
	// TestGroupDoesNotFormAtTheDeadlineOnAJoinInFlight), which saw this:
	//
	// The same root cause through the sweeper. Group of 2; ua joins (202). 1 s
	// before the deadline ux's unkeyed join takes the last slot and its send
	// hangs past the deadline; a sweep runs meanwhile: group_close.lua says
	// FULL, recordFormed finds no unreleased cancellation (ux is not fenced yet)
	// and records FORMED. ux's send then fails (503, publish_failed). Expected
	// (design.md: a join whose send failed "gives its slot back whenever its
	// release reaches Redis, deadline or not ... it never filled the group,
	// whether its 503 came just before the deadline or ..."): the group fails.
	// Observed: FORMED with 1 member of 2.
	t.Run("the sweeper does not form a group at its deadline on a join in flight", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromise(t, withEnqueuer(enq))
		enq.rec = p.rec
		sku := testservices.Name("adv3c")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		a := p.joined(sku, gid, "ua")
		p.persistMsgs(a)
		p.clock.Advance(29 * time.Second)
		enq.before = func() {
			p.clock.Advance(2 * time.Second) // the send hangs past the deadline; a sweep runs
			p.sweep()
		}
		enq.fail.Store(true)
		code, body := p.join(sku, gid, "ux")
		enq.fail.Store(false)
		enq.before = nil
		if code != http.StatusServiceUnavailable {
			t.Fatalf("ux's join whose send fails = %d %v, want 503", code, body)
		}
		p.clock.Advance(5 * time.Second)
		p.sweep()
		st, members, _ := p.groupState(gid)
		t.Logf("MySQL group %s members %d; Redis %v; ux %v", st, members, p.redisGroup(sku, gid), p.status(body2id(p, "ux")))
		if st != "FAILED" {
			t.Errorf("group of 2 with one accepted join (ux told 503, fenced publish_failed) is %s with %d member(s), want FAILED", st, members)
		}
	})

	// A join's send succeeds but Redis refuses the mark that makes it accepted.
	// It is answered as a failed send, never 202: unkeyed, it is fenced
	// publish_failed (its message takes nothing) and its slot reopens, so
	// another join fills the group; keyed, the 503 asks for a retry, which
	// replays the hold, sends again, marks it and answers 202.
	// Found by the fourth adversarial review of issue 20 (was
	// TestGroupJoinWhoseMarkFails): the join was told 202 unmarked, counted as
	// in flight, and a member's cancel then failed the group — cancelling a
	// buyer who did nothing.
	t.Run("a join whose mark fails is never told 202", func(t *testing.T) {
		for _, key := range []string{"", "k-u2"} {
			name := "unkeyed"
			if key != "" {
				name = "keyed"
			}
			t.Run(name, func(t *testing.T) {
				p := &promise{rec: &recordingEnqueuer{}}
				enq := &afterSendEnqueuer{rec: p.rec}
				p.stack = newStack(t, withEnqueuer(enq), withRedisProxy(&p.proxy))
				sku := testservices.Name("gmark")
				p.createSKU(sku, 10, 0)
				gid := p.group(sku, 2, 30)
				m1 := p.joined(sku, gid, "u1")
				p.persistMsgs(m1)

				join := func() (int, map[string]any) { return p.joinKeyed(sku, gid, "u2", key) }
				f := func() { p.proxy.Refuse(true) }
				enq.after.Store(&f)
				code, body := join()
				p.proxy.Refuse(false)
				if code != http.StatusServiceUnavailable {
					t.Fatalf("u2's join whose mark failed = %d %v, want 503 (not accepted)", code, body)
				}
				var accepted []string
				if key == "" {
					p.clock.Advance(3 * time.Second) // past the grace: the sweep drains the release
					p.sweep()
					if rg := p.redisGroup(sku, gid); rg["remaining"] != "1" {
						t.Fatalf("group in Redis after u2's 503 and a sweep = %v, want its slot back (remaining 1)", rg)
					}
					accepted = []string{m1, p.joined(sku, gid, "u3")}
				} else {
					code, body = join() // the retry with the same key
					if code != http.StatusAccepted {
						t.Fatalf("u2's retry with the same key = %d %v, want 202", code, body)
					}
					accepted = []string{m1, body["reservation_id"].(string)}
				}
				p.persistMsgs(accepted[1])
				p.wantFormed("after the group filled with accepted joins", sku, gid)
				p.clock.Advance(40 * time.Second)
				rep := p.sweep()
				p.noGroupFailed("after the deadline", sku, rep)
				for _, id := range accepted {
					p.wantStatus(id, reservation.StatusConfirmed, "")
				}
				p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: true})
			})
		}
	})

	// A keyed join's retry whose re-send fails too is answered 503, never 202
	// (nothing was sent, the hold is not accepted); were it 202, the group it
	// filled in time would form and its other member would stay.
	//
	// Found by the fifth adversarial review of issue 20 (was
	// TestKeyedJoinReplayWhoseResendFailsIsNotAccepted), which saw this:
	//
	// Group of 2; u1 joins (202, persisted). u2's keyed join takes the last
	// slot; its send fails (503, the hold waits for the retry). u2 retries with
	// the same key as told; the retry replays the HELD hold and its re-send
	// fails too. Reserve's "re-send of a replayed hold failed" branch returns
	// the HELD hold as a success: u2 is told 202 — with no message sent and the
	// hold never marked accepted. The group's slots were all taken before the
	// deadline by joins told 202, yet u2's hold expires unmarked (follow.lua:
	// never counted), its slot reopens and the sweeper fails the group,
	// cancelling u1 (who did nothing) group_failed. Expected: the retry is 503
	// (outcome unknown) — or, if 202, the group forms.
	t.Run("a keyed join's replay whose re-send fails is not accepted", func(t *testing.T) {
		enq := &switchEnqueuer{}
		p := newPromise(t, withEnqueuer(enq))
		enq.rec = p.rec
		sku := testservices.Name("r7replay")
		p.createSKU(sku, 10, 0)
		gid := p.group(sku, 2, 30)
		m1 := p.joined(sku, gid, "u1")
		p.persistMsgs(m1)

		join := func() (int, map[string]any) { return p.joinKeyed(sku, gid, "u2", "k-u2") }
		enq.fail.Store(true)
		code1, body1 := join()
		code2, body2 := join() // the retry with the same key, as a 503 asks; its send fails too
		enq.fail.Store(false)
		t.Logf("u2's join = %d %v; its retry = %d %v", code1, body1, code2, body2)
		if code1 != http.StatusServiceUnavailable {
			t.Fatalf("u2's keyed join whose send fails = %d, want 503", code1)
		}
		if code2 == http.StatusAccepted {
			t.Errorf("u2's retry whose re-send failed was told 202 (HELD) although nothing was sent and the hold is not marked accepted")
		}
		t.Logf("redis group %v", p.redisGroup(sku, gid))
		p.clock.Advance(31 * time.Second)
		p.sweep()
		p.clock.Advance(2 * time.Minute) // past u2's hold TTL
		p.sweep()
		p.clock.Advance(2 * time.Minute)
		rep := p.sweep()
		st, members, _ := p.groupState(gid)
		t.Logf("after the deadline and the hold TTL: MySQL %s members %d; Redis %v; u1 %v; report %+v",
			st, members, p.redisGroup(sku, gid), p.status(m1), rep)
		if code2 == http.StatusAccepted {
			if st != "FORMED" {
				t.Errorf("a group whose 2 slots were taken in time by joins told 202 is %s", st)
			}
			if s, reason, _ := p.row(m1); s == string(reservation.StatusCancelled) && reason == string(reservation.ReasonGroupFailed) {
				t.Errorf("u1, who did nothing, was cancelled group_failed")
			}
		}
	})

	// A keyed join into g1 is lost by a Redis failover before persist decides
	// it; its retry with the same key goes into g2, and, MySQL having no row
	// yet, Redis holds it there under the same id: a stray in another group.
	// MySQL then decides the id for g1 (that message came first). Following
	// that row returns the stray's unit and frees its slot and member entry
	// in g2 (follow.lua reads the stray's group from its hold), so g2 fills
	// with two other joiners and forms. Before, only a slot of the row's
	// group could reopen: g2 kept a slot and a member entry no reservation
	// backs, and its last joiner was told group_full.
	t.Run("a stray held in another group gives its slot back there", func(t *testing.T) {
		priv := testservices.StartRedis(t)
		p := newPromise(t, withRedis(priv.Addr))
		sku := testservices.Name("gstray")
		p.createSKU(sku, 10, 0)
		g1, g2 := p.group(sku, 2, 600), p.group(sku, 2, 600)
		priv.Snapshot()
		code, b := p.joinKeyed(sku, g1, "u", "k")
		if code != http.StatusAccepted {
			t.Fatalf("u's keyed join into g1 = %d %v, want 202", code, b)
		}
		id := b["reservation_id"].(string)
		priv.RestartFromSnapshot() // the failover loses the join: its hold, slot and member entry
		if code, b := p.joinKeyed(sku, g2, "u", "k"); code != http.StatusAccepted || b["reservation_id"] != id {
			t.Fatalf("u's retry with the key into g2 = %d %v, want 202 for %s", code, b, id)
		}
		msgs := p.msgsOf(id)
		if len(msgs) != 2 || msgs[0].GroupID != g1 || msgs[1].GroupID != g2 {
			t.Fatalf("messages of %s = %+v, want g1's then g2's", id, msgs)
		}
		p.deliverBatch(msgs[0]) // MySQL decides the id for g1; Redis's hold is the stray in g2
		p.deliverBatch(msgs[1]) // the stray's own message takes nothing
		p.wantStatus(id, reservation.StatusConfirmed, "")
		if n := p.count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND group_id = ?`, id, g1); n != 1 {
			t.Fatalf("%s is not g1's in MySQL", id)
		}
		if rg := p.redisGroup(sku, g2); rg["remaining"] != "2" {
			t.Errorf("g2 in Redis = %v, want both slots free (the stray's came back)", rg)
		}
		if m, err := p.rdb.HGetAll(context.Background(), "hf:{"+sku+"}:gm:"+g2).Result(); err != nil || len(m) != 0 {
			t.Errorf("g2's members in Redis = %v %v, want none", m, err)
		}
		ma, mb := p.joined(sku, g2, "a"), p.joined(sku, g2, "b")
		p.persistMsgs(ma, mb)
		p.wantFormed("after a and b filled g2", sku, g2)
		if _, members, _ := p.groupState(g2); members != 2 {
			t.Errorf("g2 formed with %d members in MySQL, want 2", members)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id, ma, mb}, Quiescent: true})
	})

	// The same stray, but persist confirms the id for g1 and crashes before
	// Redis follows: the stray is still HELD in g2's member list when g2
	// fails. Cancelling that member returns the stray and leaves the row,
	// g1's, as it is. Before, g2's failure refunded the buyer's g1
	// membership as group_failed: a group that did not fail lost a member.
	t.Run("a failing group leaves another group's member alone", func(t *testing.T) {
		priv := testservices.StartRedis(t)
		var crash atomic.Bool
		p := newPromise(t, withRedis(priv.Addr), withHooks(reservation.Hooks{AfterCommit: func(reservation.Reservation) error {
			if crash.CompareAndSwap(true, false) {
				return errCrash
			}
			return nil
		}}))
		sku := testservices.Name("gforeign")
		p.createSKU(sku, 10, 0)
		g1, g2 := p.group(sku, 2, 600), p.group(sku, 2, 30)
		priv.Snapshot()
		code, b := p.joinKeyed(sku, g1, "u", "k")
		if code != http.StatusAccepted {
			t.Fatalf("u's keyed join into g1 = %d %v, want 202", code, b)
		}
		id := b["reservation_id"].(string)
		priv.RestartFromSnapshot() // the failover loses the join
		if code, b := p.joinKeyed(sku, g2, "u", "k"); code != http.StatusAccepted || b["reservation_id"] != id {
			t.Fatalf("u's retry with the key into g2 = %d %v, want 202 for %s", code, b, id)
		}
		msgs := p.msgsOf(id)
		if len(msgs) != 2 || msgs[0].GroupID != g1 || msgs[1].GroupID != g2 {
			t.Fatalf("messages of %s = %+v, want g1's then g2's", id, msgs)
		}
		crash.Store(true)
		body, err := message.Encode(msgs[0])
		if err != nil {
			t.Fatal(err)
		}
		resp, err := p.persist.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{
			MessageId: "g1-join", Body: string(body), EventSource: "aws:sqs", EventSourceARN: p.queues.ARN,
		}}})
		if err != nil || len(resp.BatchItemFailures) != 1 || crash.Load() {
			t.Fatalf("persist of g1's message = %+v %v, want it to crash after its commit", resp, err)
		}
		if st, _, _ := p.row(id); st != string(reservation.StatusConfirmed) {
			t.Fatalf("%s is %s in MySQL, want CONFIRMED for g1", id, st)
		}
		if rg := p.redisGroup(sku, g2); rg["remaining"] != "1" {
			t.Fatalf("g2 in Redis = %v, want the stray still holding a slot", rg)
		}
		p.clock.Advance(31 * time.Second) // past g2's deadline, within the stray's hold TTL
		p.sweep()
		if st, _, _ := p.groupState(g2); st != "FAILED" {
			t.Fatalf("g2 is %s in MySQL, want FAILED", st)
		}
		if st, reason, refunded := p.row(id); st != string(reservation.StatusConfirmed) || refunded {
			t.Errorf("g2's failure left %s %s %s (refunded %v), want g1's member CONFIRMED", id, st, reason, refunded)
		}
		if st, members, _ := p.groupState(g1); st != "OPEN" || members != 1 {
			t.Errorf("g1 is %s with %d members in MySQL, want OPEN with u's", st, members)
		}
		p.deliverBatch(msgs[0]) // the crashed message's redelivery
		p.deliverBatch(msgs[1]) // the stray's own message takes nothing
		p.wantStatus(id, reservation.StatusConfirmed, "")
		// Redis lost the hold g1's commit took its unit from: the drift the
		// failover left is healed by reconciliation, as after any failover.
		p.wantStores("after the redeliveries", sku, 10, 0, 9)
		for range 2 {
			p.clock.Advance(time.Minute)
			p.sweep()
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
}
