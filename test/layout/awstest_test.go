package layout_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAWSTestCredentials: every test binary that links the AWS SDK's config
// loader (the default credential chain: ~/.aws, the environment, the EC2
// metadata address) runs awstest.Main from its TestMain, so no test reads
// the developer's credentials or leaves this machine, under make test or not.
func TestAWSTestCredentials(t *testing.T) {
	const loader = "github.com/aws/aws-sdk-go-v2/config"
	cmd := exec.Command("go", "list", "-test", "-f", "{{.ImportPath}}\t{{join .Deps \" \"}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -test: %v", err)
	}
	dirs := map[string]string{}
	dirOut, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Dir}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(dirOut)), "\n") {
		pkg, dir, _ := strings.Cut(line, "\t")
		dirs[pkg] = dir
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		bin, deps, _ := strings.Cut(line, "\t")
		pkg, ok := strings.CutSuffix(bin, ".test")
		if !ok || !strings.Contains(" "+deps+" ", " "+loader+" ") {
			continue // not a test binary, or one without the SDK's loader
		}
		checked++
		tests, _ := filepath.Glob(filepath.Join(dirs[pkg], "*_test.go"))
		found := false
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "func TestMain(m *testing.M) { awstest.Main(m) }") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: its tests link %s but no TestMain runs awstest.Main: add\n\tfunc TestMain(m *testing.M) { awstest.Main(m) }", pkg, loader)
		}
	}
	if checked == 0 {
		t.Fatalf("no test binary links %s: the check looks at nothing", loader)
	}
}
