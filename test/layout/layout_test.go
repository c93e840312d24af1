// Package layout_test guards the folders' promise: shared/ holds exactly
// what the Lambda functions link; developer tools (internal/), commands
// (cmd/), the API client (api/) and system tests (test/) never ship, and
// neither does the testing package.
package layout_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/holdfast/holdfast"

// goList lists packages as the Lambda build sees them: the target sam build
// and make build link for (linux/arm64, no cgo, the lambda.norpc tag), so a
// file that only that build compiles cannot hide an import.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-tags", "lambda.norpc"}, args...)...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
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
		case strings.HasPrefix(pkg, module+"/") &&
			!strings.HasPrefix(pkg, module+"/shared/") && !strings.HasPrefix(pkg, module+"/functions/"):
			// An allow-list: anything of the module outside shared/ and
			// functions/ (internal/, cmd/, test/, api/, a folder added later)
			// is not for shipping.
			t.Errorf("a function links %s, which is not under shared/", pkg)
		}
	}
	// And shared/ holds nothing a function does not link.
	for _, pkg := range goList(t, "./shared/...") {
		if !linked[pkg] {
			t.Errorf("%s is under shared/ but no function links it: move it to internal/", pkg)
		}
	}
}
