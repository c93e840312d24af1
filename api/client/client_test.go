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
// make dev's stack: the admin creates the SKU, a buyer reserves with an
// Idempotency-Key, polls it to CONFIRMED, and a retry of the same key is
// answered 200 with the same reservation.
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
	stock := int64(10)
	level, err := admin.ChangeStockWithResponse(ctx, sku, &client.ChangeStockParams{}, client.ChangeStockJSONRequestBody{Stock: &stock})
	if err != nil || level.JSON200 == nil || level.JSON200.Stock != 10 {
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
