package client_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api/client"
	"github.com/holdfast/holdfast/internal/testkit/devstacktest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// A client generated from api/openapi.yaml completes a reservation against
// make dev's stack: the admin creates the SKU with a pay window, a buyer
// reserves with an Idempotency-Key, polls it to CONFIRMED (with its pay_by),
// a retry of the same key is answered 200 with the same reservation, and
// the order service pays it: PAID, which its cancel can no longer move; and
// a buyer goes through a SKU's waiting room to buy it.
func TestGeneratedClientCompletesAReservation(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	stack := devstacktest.Start(t, env, nil)
	token := stack.Token("ann")
	bearer := client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	})
	admin, err := client.NewClientWithResponses(stack.URL)
	if err != nil {
		t.Fatal(err)
	}
	buyer, err := client.NewClientWithResponses(stack.URL, bearer)
	if err != nil {
		t.Fatal(err)
	}

	sku := testservices.Name("gen")
	stock, payWithin := int64(10), int64(900)
	level, err := admin.ChangeStockWithResponse(ctx, sku, &client.ChangeStockParams{},
		client.ChangeStockJSONRequestBody{Stock: &stock, PayWithinSeconds: &payWithin})
	if err != nil || level.JSON200 == nil || level.JSON200.Stock != 10 || level.JSON200.PayWithinSeconds != 900 {
		t.Fatalf("change stock = %v, %v", level, err)
	}
	key := "order-1"
	body := client.ReserveJSONRequestBody{Sku: sku, Qty: 2}
	res, err := buyer.ReserveWithResponse(ctx, &client.ReserveParams{IdempotencyKey: &key}, body)
	if err != nil || res.JSON202 == nil || res.JSON202.Status != client.HELD {
		t.Fatalf("reserve = %v %s, %v", res.StatusCode(), res.Body, err)
	}
	id := res.JSON202.ReservationId
	testservices.Eventually(t, 20*time.Second, "the reservation is CONFIRMED", func() bool {
		got, err := buyer.GetReservationWithResponse(ctx, id)
		return err == nil && got.JSON200 != nil && got.JSON200.Status == client.CONFIRMED
	})
	again, err := buyer.ReserveWithResponse(ctx, &client.ReserveParams{IdempotencyKey: &key}, body)
	if err != nil || again.JSON200 == nil || again.JSON200.ReservationId != id || again.JSON200.Status != client.CONFIRMED {
		t.Fatalf("replay = %v %s, %v; want 200 with %s CONFIRMED", again.StatusCode(), again.Body, err, id)
	}
	sk, err := buyer.GetSkuWithResponse(ctx, sku)
	if err != nil || sk.JSON200 == nil || sk.JSON200.Available != 8 {
		t.Fatalf("sku = %v %s, %v; want 8 available", sk.StatusCode(), sk.Body, err)
	}
	got, err := buyer.GetReservationWithResponse(ctx, id)
	if err != nil || got.JSON200 == nil || got.JSON200.PayBy == nil || got.JSON200.PayBy.Before(time.Now().Add(14*time.Minute)) {
		t.Errorf("confirmed on a SKU with a 900 s pay window: %v %s, %v; want pay_by about 15 minutes ahead", got.StatusCode(), got.Body, err)
	}

	paid, err := admin.PayReservationWithResponse(ctx, id, client.PayReservationJSONRequestBody{})
	if err != nil || paid.JSON200 == nil || paid.JSON200.Status != client.PAID || paid.JSON200.PaidAt == nil {
		t.Fatalf("pay = %v %s, %v; want 200 PAID with paid_at", paid.StatusCode(), paid.Body, err)
	}
	if got, err := buyer.GetReservationWithResponse(ctx, id); err != nil || got.JSON200 == nil || got.JSON200.Status != client.PAID {
		t.Errorf("the buyer's GET after the payment = %v %s, %v; want PAID", got.StatusCode(), got.Body, err)
	}
	cancel, err := admin.OrderCancelReservationWithResponse(ctx, id, client.OrderCancelReservationJSONRequestBody{Reason: "checkout:abandoned"})
	if err != nil || cancel.JSON409 == nil || cancel.JSON409.Error != client.PaidErrorPaid {
		t.Errorf("order cancel of a PAID reservation = %v %s, %v; want 409 paid", cancel.StatusCode(), cancel.Body, err)
	}

	// Through a waiting room: the buyer joins, anyone reads the queue
	// without a token, the admitted ticket's token buys.
	roomSKU, on := testservices.Name("genroom"), true
	if lv, err := admin.ChangeStockWithResponse(ctx, roomSKU, &client.ChangeStockParams{},
		client.ChangeStockJSONRequestBody{Stock: &stock, WaitingRoom: &on}); err != nil || lv.JSON200 == nil || !lv.JSON200.WaitingRoom || lv.JSON200.AdmitFactor == nil || *lv.JSON200.AdmitFactor != 1 {
		t.Fatalf("change stock with a room = %v %s, %v; want waiting_room true, admit_factor 1", lv.StatusCode(), lv.Body, err)
	}
	joined, err := buyer.JoinQueueWithResponse(ctx, roomSKU, client.JoinQueueJSONRequestBody{})
	if err != nil || joined.JSON200 == nil || joined.JSON200.Ticket == "" {
		t.Fatalf("join = %v %s, %v", joined.StatusCode(), joined.Body, err)
	}
	status, err := admin.QueueStatusWithResponse(ctx, roomSKU) // no token
	if err != nil || status.JSON200 == nil || !status.JSON200.Open || status.JSON200.AdmittedThrough < 1 || status.HTTPResponse.Header.Get("Cache-Control") != "public, max-age=1" {
		t.Fatalf("queue status = %v %s, %v; want 200 open, place 1 admitted, public for a second", status.StatusCode(), status.Body, err)
	}
	ticket, err := buyer.GetTicketWithResponse(ctx, roomSKU, joined.JSON200.Ticket)
	if err != nil || ticket.JSON200 == nil || ticket.JSON200.Status != client.ADMITTED || ticket.JSON200.AdmissionToken == nil {
		t.Fatalf("ticket = %v %s, %v; want ADMITTED with a token", ticket.StatusCode(), ticket.Body, err)
	}
	bought, err := buyer.ReserveWithResponse(ctx, &client.ReserveParams{AdmissionToken: ticket.JSON200.AdmissionToken}, client.ReserveJSONRequestBody{Sku: roomSKU, Qty: 1})
	if err != nil || bought.JSON202 == nil || bought.JSON202.Status != client.HELD {
		t.Fatalf("reserve with the admission = %v %s, %v; want 202 HELD", bought.StatusCode(), bought.Body, err)
	}
}

// client.gen.go is what the pinned generator makes of the current document.
func TestGeneratedClientIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the generator")
	}
	dir := t.TempDir()
	// The committed configuration, writing elsewhere.
	cfg, err := os.ReadFile("oapi-codegen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg = bytes.Replace(cfg, []byte("output: client.gen.go"), []byte("output: "+dir+"/client.gen.go"), 1)
	if !bytes.Contains(cfg, []byte(dir)) {
		t.Fatal("oapi-codegen.yaml has no `output: client.gen.go` line")
	}
	if err := os.WriteFile(dir+"/cfg.yaml", cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", dir+"/cfg.yaml", "../openapi.yaml")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oapi-codegen: %v\n%s", err, out)
	}
	fresh, err := os.ReadFile(dir + "/client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Errorf("api/client/client.gen.go is stale: run go generate ./api/client")
	}
}
