// Package browser runs Debian's headless Chromium for a test, driven by
// chromedp: one browser per test, each tab in a browser context of its own
// (its own cookies and storage: another buyer), screenshots into a
// directory. Chromium is installed by scripts/services.sh under make test
// (HOLDFAST_BROWSER=1); without it the test skips, or fails under
// HOLDFAST_REQUIRE_SERVICES=1.
package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/holdfast/holdfast/internal/services"
)

// Require returns Chromium's path, or skips the test (fails it under
// HOLDFAST_REQUIRE_SERVICES=1) when it is not installed.
func Require(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath(services.Chromium)
	if err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s is required but not installed (make test installs it: scripts/services.sh with HOLDFAST_BROWSER=1)", services.Chromium)
		}
		t.Skipf("%s not installed; make test installs it", services.Chromium)
	}
	return path
}

// Start starts a headless Chromium with a fresh profile, stopped at the end
// of the test, and returns its context (for Tab).
func Start(t testing.TB) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Require(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(900, 700),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // launches it
		t.Fatalf("start %s: %v", services.Chromium, err)
	}
	return ctx
}

// Tab opens a tab in a new browser context of b (Start's): a buyer whose
// storage no other tab shares. Closed at the end of the test.
func Tab(t testing.TB, b context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("new tab: %v", err)
	}
	return ctx
}

// Do runs steps in the tab, failing after timeout (a step that waits for an
// element waits for ever otherwise).
func Do(ctx context.Context, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

// WaitAttr waits until the element sel's attribute attr is one of want and
// returns it (the page's own polling, watched on every DOM change).
func WaitAttr(ctx context.Context, timeout time.Duration, sel, attr string, want ...string) (string, error) {
	got, err := chromedp.Run(ctx, chromedp.PollFunction[string](`(sel, attr, want) => {
		const el = document.querySelector(sel);
		const v = el ? el.getAttribute(attr) : null;
		return want.includes(v) ? v : null;
	}`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(timeout), chromedp.WithPollingArgs(sel, attr, want)))
	if err != nil {
		now, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(document.querySelector(%q)||{getAttribute:()=>"(no element)"}).getAttribute(%q) + " — " + (document.getElementById("message")||{}).textContent`, sel, attr)))
		return "", fmt.Errorf("%s[%s] not %v within %v (it is %q): %w", sel, attr, want, timeout, now, err)
	}
	return got, nil
}

// Until waits until the JavaScript expression expr is truthy in the tab
// (evaluated on every DOM change) and returns its value as text.
func Until(ctx context.Context, timeout time.Duration, expr string) (string, error) {
	got, err := chromedp.Run(ctx, chromedp.Poll[any](expr, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("state") ? document.getElementById("state").dataset.state + " — " + document.getElementById("message").textContent : "(no #state)"`))
		return "", fmt.Errorf("%s not true within %v (the page is %s): %w", expr, timeout, state, err)
	}
	return fmt.Sprint(got), nil
}

// Screenshot saves the tab's page as dir/name.png.
func Screenshot(t testing.TB, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Error(err)
	}
}
