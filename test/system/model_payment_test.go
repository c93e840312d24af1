package system_test

// The model's order-service actions (TestModel): pay, the order service's
// cancel, the two racing a buyer's cancel, and time passing a payment's
// deadline for the sweeper's payment timeout.

import (
	"sync"
	"time"

	"pgregory.net/rapid"
)

// modelNote is the reason the model's order service gives its cancels.
const modelNote = "model-check"

// checkPayBy holds MySQL's payment deadline of x's row to the model: a
// buy's exactly (its confirmation plus the window); a join's is none until
// its group is FORMED in MySQL and then one (learned: it opens at the
// formation, whose instant MySQL records).
func (m *modelMachine) checkPayBy(t *rapid.T, x *modelRes, row modelRow, groups func() map[string]string) {
	t.Helper()
	if row.status != mConfirmed {
		return
	}
	if row.group == "" {
		if !row.payBy.Equal(x.payBy) {
			m.fatalf(t, "MySQL row of %s: pay_by %v; model %v (confirmed with a window of %v)", x, row.payBy, x.payBy, m.payWithin)
		}
		return
	}
	formed := groups()[row.group] == "FORMED"
	switch {
	case m.payWithin == 0 && !row.payBy.IsZero():
		m.fatalf(t, "join %s is due %v, but the SKU has no pay window", x, row.payBy)
	case m.payWithin > 0 && formed && row.payBy.IsZero():
		m.fatalf(t, "join %s of a FORMED group has no pay window", x)
	case !formed && !row.payBy.IsZero():
		m.fatalf(t, "join %s of a group MySQL has %q is due %v: a join's window opens when its group forms", x, groups()[row.group], row.payBy)
	}
	x.payBy = row.payBy
}

// learnPayBy takes the joins' payment deadlines from MySQL (a formation
// sets them); checkPayBy holds them to the rule.
func (m *modelMachine) learnPayBy(t *rapid.T) {
	t.Helper()
	for id, row := range m.rows(t) {
		if x := m.res[id]; x != nil && row.group != "" && row.status == mConfirmed && x.row == mConfirmed {
			x.payBy = row.payBy
		}
	}
}

// expectPay is the answer POST /admin/reservations/{id}/paid must give
// (code, status or error), applied to the model.
func (m *modelMachine) expectPay(t *rapid.T, x *modelRes) (int, string) {
	t.Helper()
	switch {
	case x.paid:
		return 200, "PAID"
	case x.row == mConfirmed && x.group != nil && m.groupStatuses(t)[x.group.id] != "FORMED":
		return 409, "group_not_formed"
	case x.row == mConfirmed:
		x.paid = true
		return 200, "PAID"
	case x.row == mCancelled:
		return 409, "cancelled"
	case x.hold != "":
		return 409, "not_confirmed"
	}
	return 404, "not_found"
}

func (m *modelMachine) checkPay(t *rapid.T, what string, r modelReply, x *modelRes, code int, want string) {
	t.Helper()
	if code == 404 && !m.exact && r.code == 409 && r.str("error") == "not_confirmed" {
		return // Redis lost the SKU: whether a hold of the id is still there is not predicted
	}
	switch {
	case r.code != code:
	case code == 200 && r.str("status") == want && r.str("reservation_id") == x.id && r.num("qty") == int64(x.rowQty):
		return
	case code == 409 && want == "cancelled" && r.str("error") == want && r.str("reason") == x.reason:
		return
	case code != 200 && want != "cancelled" && r.str("error") == want:
		return
	}
	m.fatalf(t, "%s = %s, want %d %s", what, r, code, want)
}

func (m *modelMachine) actPay(t *rapid.T) {
	acc := m.accepted()
	if len(acc) == 0 {
		t.SkipNow() // nothing accepted
	}
	x := recent(t, acc, "reservation")
	r := m.call(t, "POST", "/admin/reservations/"+x.id+"/paid", nil, nil)
	t.Logf("pay %s → %s", x, r.short())
	code, want := m.expectPay(t, x)
	m.checkPay(t, "pay "+x.String(), r, x, code, want)
}

func (m *modelMachine) actOrderCancel(t *rapid.T) {
	acc := m.accepted()
	if len(acc) == 0 {
		t.SkipNow() // nothing accepted
	}
	x := recent(t, acc, "reservation")
	r := m.call(t, "POST", "/admin/reservations/"+x.id+"/cancel", map[string]any{"reason": modelNote}, nil)
	t.Logf("order cancel %s → %s", x, r.short())
	code, status, reason := m.expectCancelFor(x, "order_cancelled")
	m.checkCancel(t, "order cancel "+x.String(), r, code, status, reason)
	if code == 200 && x.reason == "order_cancelled" && r.str("note") != modelNote {
		m.fatalf(t, "order cancel %s = %s, want its note %q", x, r, modelNote)
	}
}

// actPayAndCancel races a payment and a cancel (the buyer's or the order
// service's) of one payable reservation: exactly one of them wins.
func (m *modelMachine) actPayAndCancel(t *rapid.T) {
	var payable []*modelRes
	for _, x := range m.accepted() {
		if x.row == mConfirmed && !x.paid && (x.group == nil || m.groupStatuses(t)[x.group.id] == "FORMED") {
			payable = append(payable, x)
		}
	}
	if len(payable) == 0 {
		t.SkipNow() // nothing payable
	}
	x := recent(t, payable, "reservation")
	byOrder := rapid.Bool().Draw(t, "byOrderService")
	var wg sync.WaitGroup
	var pay, cancel modelReply
	var perr, cerr error
	wg.Go(func() { pay, perr = m.do("POST", "/admin/reservations/"+x.id+"/paid", nil, nil) })
	wg.Go(func() {
		if byOrder {
			cancel, cerr = m.do("POST", "/admin/reservations/"+x.id+"/cancel", map[string]any{"reason": modelNote}, nil)
		} else {
			cancel, cerr = m.do("DELETE", "/reservations/"+x.id, nil, nil)
		}
	})
	wg.Wait()
	if perr != nil || cerr != nil {
		m.fatalf(t, "pay and cancel %s: %v %v", x, perr, cerr)
	}
	t.Logf("pay and cancel (order service %v) %s at once → %s, %s", byOrder, x, pay.short(), cancel.short())
	reason := "buyer_cancelled"
	if byOrder {
		reason = "order_cancelled"
	}
	switch {
	case pay.code == 200 && pay.str("status") == "PAID" && cancel.code == 409 && cancel.str("error") == "paid":
		x.paid = true
	case cancel.code == 200 && cancel.str("status") == mCancelled && cancel.str("reason") == reason &&
		pay.code == 409 && pay.str("error") == "cancelled" && pay.str("reason") == reason:
		m.refund(x, reason)
	default:
		m.fatalf(t, "pay and cancel %s at once = %s and %s, want exactly one to win", x, pay, cancel)
	}
}

// actTimePastPayment moves time past an unpaid reservation's payment
// deadline and the sweep's grace.
func (m *modelMachine) actTimePastPayment(t *rapid.T) {
	var due []*modelRes
	for _, x := range m.all {
		if x.row == mConfirmed && !x.paid && !x.payBy.IsZero() && x.payBy.After(m.now().Add(-modelGrace)) {
			due = append(due, x)
		}
	}
	if len(due) == 0 {
		t.SkipNow() // no payment due later
	}
	x := recent(t, due, "reservation")
	m.advance(t, x.payBy.Sub(m.now())+modelGrace+time.Second)
}
