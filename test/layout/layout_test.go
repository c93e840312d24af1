// Package layout_test guards the folders' promise: shared/ holds exactly
// what the Lambda functions link; developer tools (internal/), commands
// (cmd/) and system tests (test/) never ship, and neither does the testing
// package.
package layout_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/holdfast/holdfast"

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

func TestFunctionsLinkOnlyShared(t *testing.T) {
	linked := map[string]bool{}
	for _, pkg := range goList(t, "-deps", "./functions/...") {
		linked[pkg] = true
		switch {
		case pkg == "testing" || strings.HasPrefix(pkg, "testing/"):
			t.Errorf("a function links %s: test code ships", pkg)
		case strings.HasPrefix(pkg, module+"/internal/"), strings.HasPrefix(pkg, module+"/cmd/"),
			strings.HasPrefix(pkg, module+"/test/"), strings.HasPrefix(pkg, module+"/api/"):
			t.Errorf("a function links %s, which is a tool, a command or a test", pkg)
		}
	}
	// And shared/ holds nothing a function does not link.
	for _, pkg := range goList(t, "./shared/...") {
		if !linked[pkg] {
			t.Errorf("%s is under shared/ but no function links it: move it to internal/", pkg)
		}
	}
}
