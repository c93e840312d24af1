package system_test

// A join whose send is still in flight holds its slot but has not counted
// yet: nothing records its group FORMED until it is accepted (marked by
// group_accept.lua once sent) or decided. Found by the third adversarial
// review of issue 20 (each test's comment says what it observed before).

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

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

// TestGroupDoesNotFormWhilePersistMeetsAJoinInFlight: group of 2. ua joins (202).
// ux's unkeyed join takes the last slot; its SQS send is slow and then
// fails (503, fenced publish_failed). While ux's send is in flight, ua's
// message is persisted: persist's formGroup sees every slot taken in Redis
// and records FORMED (MySQL, then Redis). ux's release then meets a FORMED
// group and its slot never reopens.
// Expected (design.md "Groups": a join that is never accepted ... its slot
// reopens: it never formed the group): the group stays OPEN with one free
// slot; ub can join. Observed: FORMED with 1 member of 2, ub refused
// group_full, ux's retry refused already_joined though ux holds nothing.
func TestGroupDoesNotFormWhilePersistMeetsAJoinInFlight(t *testing.T) {
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
}

// TestGroupCalledFormedAcceptsNoJoin: group of 2. ua joins
// (202). ux's unkeyed join takes the last slot and its send hangs; ua's
// message is persisted meanwhile, and persist's formGroup sees the group
// full in Redis (ux's slot). Before it writes FORMED, ux's send fails: ux
// is fenced publish_failed and released (MySQL still OPEN, so the slot
// reopens in Redis and the row is marked released). recordFormed then finds
// no unreleased cancellation and records FORMED in MySQL; telling Redis
// fails (a blip), so Redis stays OPEN with a free slot until a sweep.
// ub's join is then accepted (202) into a group GET /groups calls FORMED.
// Expected (design.md: "no join is accepted into a group GET /groups calls
// FORMED"; a join never accepted never forms it): MySQL stays OPEN, or ub
// is refused. Observed: ub 202 while GET /groups says FORMED, and the
// group was recorded FORMED while it had a free slot.
func TestGroupCalledFormedAcceptsNoJoin(t *testing.T) {
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
}

// TestGroupDoesNotFormAtTheDeadlineOnAJoinInFlight: the same root cause
// through the sweeper. Group of 2; ua joins (202). 1 s before the deadline
// ux's unkeyed join takes the last slot and its send hangs past the
// deadline; a sweep runs meanwhile: group_close.lua says FULL, recordFormed
// finds no unreleased cancellation (ux is not fenced yet) and records
// FORMED. ux's send then fails (503, publish_failed).
// Expected (design.md: a join whose send failed "gives its slot back
// whenever its release reaches Redis, deadline or not ... it never filled
// the group, whether its 503 came just before the deadline or ..."): the
// group fails. Observed: FORMED with 1 member of 2.
func TestGroupDoesNotFormAtTheDeadlineOnAJoinInFlight(t *testing.T) {
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

// TestGroupJoinWhoseMarkFails: a join's send succeeds but Redis refuses the
// mark that makes it accepted. It is answered as a failed send, never 202:
// unkeyed, it is fenced publish_failed (its message takes nothing) and its
// slot reopens, so another join fills the group; keyed, the 503 asks for a
// retry, which replays the hold, sends again, marks it and answers 202.
// (Found by the fourth adversarial review of issue 20: the join was told 202
// unmarked, counted as in flight, and a member's cancel then failed the
// group — cancelling a buyer who did nothing.)
func TestGroupJoinWhoseMarkFails(t *testing.T) {
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
}
