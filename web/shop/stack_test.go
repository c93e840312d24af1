package shop_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/devstacktest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// The buyer page against make dev's stack (the project's real services and
// wiring, the dev sign-in): a waiting-room SKU with 2 units; four buyers in
// tabs of their own sign in and join while the countdown runs; at the
// opening each learns its place, the two admitted buy and see CONFIRMED
// (persist confirmed them in MySQL), the other two SOLD_OUT.
func TestBuyerPageThroughTheDevStack(t *testing.T) {
	env := testservices.Require(t)
	stack := devstacktest.StartShop(t, env, map[string]string{"HOLDFAST_LOG_LEVEL": "warn"})
	sku := testservices.Name("page")
	admin := func(body string) {
		t.Helper()
		req, _ := http.NewRequest("PUT", stack.URL+"/admin/skus/"+sku+"/stock", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("PUT stock %s = %d %s", body, resp.StatusCode, b)
		}
	}
	// The opening ten minutes ahead while the buyers arrive (the queue opens
	// HOLDFAST_QUEUE_LEAD, 15 min, before it), then moved to a moment ahead:
	// the countdown is seen however slow the machine is.
	admin(`{"stock":2,"waiting_room":true,"admit_factor":1,"opens_at":"` + time.Now().Add(10*time.Minute).UTC().Format(time.RFC3339Nano) + `"}`)
	sale(t, stack.URL, sku, []string{"ann", "bob", "cat", "dan"}, 2, func(at time.Time) {
		admin(`{"add":0,"opens_at":"` + at.UTC().Format(time.RFC3339Nano) + `"}`)
	}, screenshotDir(t))
}
