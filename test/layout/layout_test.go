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

// TestLayers: handlers translate and never reach an adapter; adapters sit
// beside the protocol and never reach each other (docs/design.md, "Parts").
// What both sides of a wire share (the queue message) lives in a plain
// package under shared/ that either may import. Test files are held to it
// too.
func TestLayers(t *testing.T) {
	const handlers, adapters = module + "/shared/handlers/", module + "/shared/adapters/"
	adapterOf := func(pkg string) string { // "redisstore" for …/adapters/redisstore/…
		rest, ok := strings.CutPrefix(pkg, adapters)
		if !ok {
			return ""
		}
		name, _, _ := strings.Cut(rest, "/")
		return name
	}
	lines := goList(t, "-f", `{{.ImportPath}}{{range .Imports}},{{.}}{{end}}{{range .TestImports}},{{.}}{{end}}{{range .XTestImports}},{{.}}{{end}}`,
		"./shared/handlers/...", "./shared/adapters/...")
	checked := 0
	for _, line := range lines {
		imports := strings.Split(line, ",")
		pkg := imports[0]
		checked++
		for _, imp := range imports[1:] {
			to := adapterOf(imp)
			switch {
			case to == "":
			case strings.HasPrefix(pkg, handlers):
				t.Errorf("handler %s imports the adapter %s: handlers reach adapters only through the service's ports", pkg, imp)
			case adapterOf(pkg) != to:
				t.Errorf("adapter %s imports the adapter %s: adapters never reach each other", pkg, imp)
			}
		}
	}
	if checked == 0 {
		t.Fatal("go list found no handler or adapter packages")
	}
}
