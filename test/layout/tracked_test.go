package layout_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTracked is the largest file the repository holds outside testdata/ and
// docs/: sources and fixtures are far smaller; anything bigger is an output.
const maxTracked = 1 << 20

// tracked lists the files git tracks, each with its mode ("100755"), or
// skips when this is not a git checkout (a source archive).
func tracked(t *testing.T) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: cannot tell which files are tracked")
	}
	cmd := exec.Command("git", "ls-files", "-s", "-z")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v): no tracked files to check", err)
	}
	files := map[string]string{}
	for _, rec := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		meta, path, ok := strings.Cut(rec, "\t")
		if !ok {
			continue
		}
		files[path] = strings.Fields(meta)[0]
	}
	return files
}

// executableMagic are the first bytes of the executable formats a Go build
// writes: ELF, Mach-O (both byte orders, 32 and 64 bit, universal) and PE.
var executableMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, {0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
}

func head(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := io.ReadFull(f, b)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return b[:k], err
}

func underDir(path string, dirs ...string) bool {
	for _, part := range strings.Split(filepath.ToSlash(path), "/") {
		for _, d := range dirs {
			if part == d {
				return true
			}
		}
	}
	return false
}

// TestTrackedFiles: nothing built is committed. No tracked file is a
// compiled executable or carries the exec bit without being a script, and
// none outside testdata/ or docs/ is over 1 MB.
func TestTrackedFiles(t *testing.T) {
	files := tracked(t)
	for path, mode := range files {
		if mode == "120000" || mode == "160000" { // a symlink, a submodule
			continue
		}
		full := filepath.Join("../..", path)
		st, err := os.Stat(full)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		b, err := head(full, 4)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		for _, magic := range executableMagic {
			if bytes.HasPrefix(b, magic) {
				t.Errorf("%s is a compiled executable: built outputs are never committed (git rm --cached it; .gitignore)", path)
				break
			}
		}
		if mode == "100755" && !bytes.HasPrefix(b, []byte("#!")) {
			t.Errorf("%s is executable but not a script (no #!): built outputs are never committed", path)
		}
		if st.Size() > maxTracked && !underDir(path, "testdata", "docs") {
			t.Errorf("%s is %d bytes, over %d outside testdata/ and docs/: an output, not a source", path, st.Size(), maxTracked)
		}
	}
}

// TestGitignore: what `go build ./cmd/<name>` or `./functions/<name>` leaves
// at the root is ignored, as are bin/ and the local data of make dev.
func TestGitignore(t *testing.T) {
	b, err := os.ReadFile("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	ignored := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		ignored[strings.TrimSpace(line)] = true
	}
	want := []string{"/bin/", "/.holdfast/", "/.aws-sam/"}
	for _, parent := range []string{"cmd", "functions"} {
		entries, err := os.ReadDir(filepath.Join("../..", parent))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() {
				want = append(want, "/"+e.Name())
			}
		}
	}
	for _, w := range want {
		if !ignored[w] {
			t.Errorf(".gitignore does not ignore %s", w)
		}
	}
}
