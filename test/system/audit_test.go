package system_test

// The ledger audit: each sweep checks every live SKU's books in MySQL
// (stock put in = available + sold) and measures Redis's drift; a unit
// removed behind the protocol's back, in either store, is reported by the
// next sweep, in its metric and in GET /admin/skus/{sku}/report.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// withOut sends the functions' logs and EMF lines to w.
func withOut(w io.Writer) stackOption {
	return func(_ *stack, o *app.Options, _ map[string]string) { o.Out = w }
}

// mismatchOf is sku's ledger mismatch as the sweep report names it (0 when it balances).
func mismatchOf(rep reservation.SweepReport, sku string) int64 {
	for _, d := range rep.WorstMismatch {
		if d.SKU == sku {
			return d.Drift
		}
	}
	return 0
}

// TestLedgerAudit: a clean SKU audits clean; a unit taken out of MySQL's
// available by hand is a ledger_mismatch of 1 naming the SKU; a unit taken
// out of a Redis bucket by hand is a drift of 1; the report route shows
// each, with the last audit's time and result.
func TestLedgerAudit(t *testing.T) {
	out := &syncBuffer{}
	p := newPromise(t, withOut(out))
	ctx := context.Background()
	clean, mysqlLost, redisLost := testservices.Name("aud-clean"), testservices.Name("aud-mysql"), testservices.Name("aud-redis")
	for _, sku := range []string{clean, mysqlLost, redisLost} {
		p.createSKU(sku, 10, 0)
	}
	sold := p.reserved(clean, "ann", 2, "")
	p.persistMsgs(sold)
	refunded := p.reserved(clean, "bob", 1, "")
	p.persistMsgs(refunded)
	if r, err := p.app.Service.Cancel(ctx, refunded, "bob"); err != nil || r.Status != reservation.StatusCancelled {
		t.Fatalf("cancel of the confirmed reservation = %+v %v", r, err)
	}

	if _, err := p.db.ExecContext(ctx, `UPDATE product_stock SET available = available - 1 WHERE sku = ?`, mysqlLost); err != nil {
		t.Fatal(err)
	}
	if err := p.rdb.DecrBy(ctx, "hf:{"+redisLost+"}:stock", 1).Err(); err != nil {
		t.Fatal(err)
	}

	rep := p.sweep()
	if rep.Audited < 3 {
		t.Errorf("sweep audited %d SKUs, want the 3 live ones at least", rep.Audited)
	}
	if m := mismatchOf(rep, mysqlLost); m != 1 || rep.Mismatched != 1 || rep.MismatchUnits != 1 {
		t.Errorf("sweep report = mismatch %d of %s, %d SKUs, %d units (%+v); want 1 of %s alone", m, mysqlLost, rep.Mismatched, rep.MismatchUnits, rep.WorstMismatch, mysqlLost)
	}
	if d := driftOf(rep, redisLost); d != 1 {
		t.Errorf("drift of %s = %d, want 1 (Redis lost a unit)", redisLost, d)
	}
	if d := driftOf(rep, clean); d != 0 || mismatchOf(rep, clean) != 0 {
		t.Errorf("the clean SKU drifts %d, mismatches %d; want 0 and 0", d, mismatchOf(rep, clean))
	}
	if err := p.app.Metrics.Flush(); err != nil { // as the Lambda wrapper does after each invocation
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, `"ledger_mismatch":1`) {
		t.Errorf("the sweeper's EMF output has no ledger_mismatch of 1:\n%s", s)
	}
	if !strings.Contains(s, `"msg":"ledger mismatch: stock put in is not available + taken","function":"test","sku":"`+mysqlLost+`"`) {
		t.Errorf("the sweeper's log does not name %s's mismatch:\n%s", mysqlLost, s)
	}

	report := func(sku string) map[string]any {
		t.Helper()
		code, body, _ := p.callOn(t, p.api, "GET", "/admin/skus/"+sku+"/report", "", nil)
		if code != 200 {
			t.Fatalf("GET report of %s = %d %v", sku, code, body)
		}
		return body
	}
	last := func(body map[string]any) map[string]any {
		t.Helper()
		la, ok := body["last_audit"].(map[string]any)
		if !ok || la["at"] == "" {
			t.Fatalf("report %v has no last_audit", body)
		}
		return la
	}

	r := report(clean)
	if la := last(r); la["clean"] != true || r["ledger_mismatch"] != float64(0) || r["drift"] != float64(0) || r["put_in"] != float64(10) {
		t.Errorf("clean SKU's report = %v, want put_in 10, no mismatch, no drift, last audit clean", r)
	}
	if r["sold"] != float64(2) || r["mysql_available"] != float64(8) || r["returned"] != float64(1) || r["paid"] != float64(0) {
		t.Errorf("clean SKU's report = %v, want 2 sold, 8 available, 1 returned, nothing paid", r)
	}

	r = report(mysqlLost)
	if la := last(r); la["clean"] != false || la["ledger_mismatch"] != float64(1) || r["ledger_mismatch"] != float64(1) {
		t.Errorf("report of the SKU MySQL lost a unit of = %v, want ledger_mismatch 1 now and in the last audit", r)
	}

	r = report(redisLost)
	if la := last(r); la["clean"] != false || la["drift"] != float64(1) || la["ledger_mismatch"] != float64(0) || r["drift"] != float64(1) {
		t.Errorf("report of the SKU Redis lost a unit of = %v, want drift 1 now and in the last audit, books balanced", r)
	}
}
