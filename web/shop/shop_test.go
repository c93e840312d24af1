package shop_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/holdfast/holdfast/internal/testkit/browser"
)

// screenshotDir is where a test saves the page in each state: under
// HOLDFAST_SCREENSHOTS when set (to look at them), else the test's own
// temporary directory.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("HOLDFAST_SCREENSHOTS"); d != "" {
		dir := filepath.Join(d, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// sale drives buyers' tabs through a waiting-room sale of units units on
// the page at base: each signs in and joins while the countdown runs; then
// open moves the opening a moment ahead; at the opening each learns its
// place, the first units places are admitted and buy (CONFIRMED), the rest
// see SOLD_OUT. Each state's screenshot goes to dir. It returns each
// buyer's final state and place.
func sale(t *testing.T, base, sku string, buyers []string, units int, open func(time.Time), dir string) {
	t.Helper()
	b := browser.Start(t)
	tabs := make([]context.Context, len(buyers))
	const step = 30 * time.Second
	for i, name := range buyers {
		tab := browser.Tab(t, b)
		tabs[i] = tab
		if err := browser.Do(tab, step, chromedp.Navigate(base+"/shop/?sku="+sku)); err != nil {
			t.Fatal(err)
		}
		if _, err := browser.WaitAttr(tab, step, "#state", "data-state", "SIGNED_OUT"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if i == 0 {
			browser.Screenshot(t, tab, dir, "1-signed-out")
		}
		if err := browser.Do(tab, step, chromedp.SendKeys("#user", name), chromedp.Click("#signin-button")); err != nil {
			t.Fatal(err)
		}
		if _, err := browser.WaitAttr(tab, step, "#state", "data-state", "COUNTDOWN"); err != nil {
			t.Fatalf("%s after sign-in: %v", name, err)
		}
		ms, err := browser.Until(tab, step, `Number(document.getElementById("countdown").dataset.remainingMs) > 0 && document.getElementById("countdown").textContent`)
		if err != nil {
			t.Fatalf("%s: no countdown: %v", name, err)
		}
		if who, _ := chromedp.Run(tab, chromedp.Text("#who")); who != name {
			t.Errorf("%s's page says signed in as %q", name, who)
		}
		if i == 0 {
			t.Logf("%s sees the countdown: %s", name, ms)
			browser.Screenshot(t, tab, dir, "2-countdown")
		}
		if err := browser.Do(tab, step, chromedp.Click("#join")); err != nil {
			t.Fatal(err)
		}
		if _, err := browser.WaitAttr(tab, step, "#state", "data-state", "WAITING"); err != nil {
			t.Fatalf("%s after joining: %v", name, err)
		}
		if pos, _ := chromedp.Run(tab, chromedp.AttributeValue("#position", "data-position")); pos.Value != "" {
			t.Errorf("%s has place %q before the opening, want none (places are drawn at the opening)", name, pos.Value)
		}
	}
	browser.Screenshot(t, tabs[0], dir, "3-waiting-before-opening")

	open(time.Now().Add(2 * time.Second))

	type outcome struct {
		name, state string
		place       int
		err         error
	}
	results := make([]outcome, len(buyers))
	var wg sync.WaitGroup
	// No one buys before every page shows its place: on a busy machine the
	// units could otherwise sell out before a slow page's first look after
	// the opening, and a page that learns SOLD_OUT from the public state
	// needs no place.
	var placed sync.WaitGroup
	placed.Add(len(buyers))
	for i, name := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tab := tabs[i]
			fail := func(err error) { results[i] = outcome{name: name, err: err} }
			p, err := browser.Until(tab, step, `document.getElementById("position").dataset.position`)
			placed.Done()
			if err != nil {
				fail(fmt.Errorf("no place after the opening: %w", err))
				return
			}
			placed.Wait()
			place, _ := strconv.Atoi(p)
			st, err := browser.WaitAttr(tab, step, "#state", "data-state", "ADMITTED", "SOLD_OUT")
			if err != nil {
				fail(err)
				return
			}
			if st == "ADMITTED" {
				browser.Screenshot(t, tab, dir, "4-admitted-"+name)
				if err := browser.Do(tab, step, chromedp.Click("#buy")); err != nil {
					fail(err)
					return
				}
				if st, err = browser.WaitAttr(tab, step, "#state", "data-state", "CONFIRMED", "SOLD_OUT", "CANCELLED", "EXPIRED"); err != nil {
					fail(err)
					return
				}
			} else {
				browser.Screenshot(t, tab, dir, "4-waiting-"+name)
			}
			browser.Screenshot(t, tab, dir, "5-"+st+"-"+name)
			results[i] = outcome{name: name, state: st, place: place}
		}()
	}
	wg.Wait()
	var confirmed, soldOut, places []int
	for _, r := range results {
		if r.err != nil {
			t.Errorf("%s: %v", r.name, r.err)
			continue
		}
		t.Logf("%s: place %d, %s", r.name, r.place, r.state)
		places = append(places, r.place)
		switch r.state {
		case "CONFIRMED":
			confirmed = append(confirmed, r.place)
		case "SOLD_OUT":
			soldOut = append(soldOut, r.place)
		default:
			t.Errorf("%s ends %s, want CONFIRMED or SOLD_OUT", r.name, r.state)
		}
	}
	slices.Sort(places)
	slices.Sort(confirmed)
	if t.Failed() {
		return
	}
	if want := seq(1, len(buyers)); !slices.Equal(places, want) {
		t.Errorf("places %v, want %v (each buyer a place of their own)", places, want)
	}
	if want := seq(1, units); !slices.Equal(confirmed, want) {
		t.Errorf("CONFIRMED at places %v, want %v (the first %d in line buy the %d units)", confirmed, want, units, units)
	}
	if len(soldOut) != len(buyers)-units {
		t.Errorf("%d see SOLD_OUT, want %d", len(soldOut), len(buyers)-units)
	}
	t.Logf("screenshots in %s", dir)
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// The page's side of the waiting room against a fake of its API (ROOM_API's
// shapes): four buyers join before the opening; at the opening each learns
// its place; the two admitted buy and see CONFIRMED, the other two SOLD_OUT.
// The page fetches its own ticket only once its turn may have come: never
// before the opening, a few times each after it, while the public state is
// polled every second.
func TestBuyerPageAgainstTheContract(t *testing.T) {
	f := newFakeRoom("fake-phone", 2, time.Now().Add(time.Hour))
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	sale(t, srv.URL, f.sku, []string{"ann", "bob", "cat", "dan"}, 2, func(at time.Time) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.opensAt = at
	}, screenshotDir(t))
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.early != 0 {
		t.Errorf("%d ticket GETs before the opening, want none (the public state says when to look)", f.early)
	}
	for u, n := range f.ticketGets {
		if n > 4 {
			t.Errorf("%s's page fetched its ticket %d times, want a few (to learn its place, at its turn)", u, n)
		}
	}
	if f.publicGets == 0 {
		t.Error("no page polled the public queue state")
	}
	t.Logf("public polls %d, ticket GETs %v", f.publicGets, f.ticketGets)
}
