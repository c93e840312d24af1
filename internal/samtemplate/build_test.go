package samtemplate_test

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/holdfast/holdfast/internal/services"
)

// samCopy copies src to dst as sam build copies a function's CodeUri to its
// scratch directory (aws-lambda-builders' CopySourceAction, shutil.copytree
// with .aws-sam and .git ignored at any depth): links followed, and an error
// for anything that is neither a file nor a directory (a socket, a FIFO).
// skip leaves out further paths relative to src.
func samCopy(src, dst string, skip ...string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if rel != "." && (d.Name() == ".git" || d.Name() == ".aws-sam" || contains(skip, rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case info.IsDir():
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case info.Mode().IsRegular():
			return copyFile(path, target, info.Mode().Perm())
		case info.Mode()&fs.ModeSocket != 0:
			return fmt.Errorf("%s is a socket, which sam build cannot copy", rel)
		default:
			return fmt.Errorf("%s is neither a file nor a directory (%v): sam build cannot copy it", rel, info.Mode().Type())
		}
	})
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func copyFile(from, to string, perm fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// devDir is where make dev keeps its data in a checkout (the Makefile's
// DEV_DIR, which it passes to scripts/dev.sh).
func devDir(t *testing.T) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DEV_DIR\s*\?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no DEV_DIR")
	}
	return string(m[1])
}

// TestSamBuild does what `sam build` does for each function (BuildMethod:
// makefile, CodeUri: .) while `make dev` runs in the same checkout: the
// servers started as make dev starts them, with their data where make dev
// keeps it. sam build copies CodeUri to a scratch directory and runs
// `make --makefile <Makefile> build-<LogicalId>` there with ARTIFACTS_DIR
// set; the copy succeeds and each build leaves an arm64 executable
// bootstrap for provided.al2023.
func TestSamBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five binaries")
	}
	for _, bin := range []string{"redis-server", "mariadbd", "mariadb-install-db", filepath.Join(root, "bin", "goaws")} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
				t.Fatalf("%s is required (make test installs it): %v", bin, err)
			}
			t.Skipf("%s is not installed (scripts/services.sh install)", bin)
		}
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	// A checkout of this tree without the developer's own outputs and data.
	checkout := t.TempDir()
	if err := samCopy(absRoot, checkout, "bin", ".holdfast"); err != nil {
		t.Fatal(err)
	}
	dev := filepath.Join(checkout, devDir(t))
	if err := services.Start(context.Background(), absRoot, dev, services.Options{}); err != nil {
		t.Fatalf("start the services as make dev does: %v", err)
	}
	t.Cleanup(func() { services.Stop(dev, io.Discard) })

	scratch := t.TempDir()
	if err := samCopy(checkout, scratch); err != nil {
		t.Fatalf("sam build's copy of CodeUri while make dev runs: %v", err)
	}
	for _, fn := range []string{"ReserveFunction", "PersistFunction", "CompensateFunction", "SweeperFunction", "MigrateFunction"} {
		t.Run(fn, func(t *testing.T) {
			art := t.TempDir()
			cmd := exec.Command("make", "--makefile", filepath.Join(scratch, "Makefile"), "build-"+fn)
			cmd.Dir = scratch
			cmd.Env = append(os.Environ(), "ARTIFACTS_DIR="+art)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("make build-%s: %v\n%s", fn, err, out)
			}
			f, err := elf.Open(filepath.Join(art, "bootstrap"))
			if err != nil {
				t.Fatalf("bootstrap: %v", err)
			}
			defer f.Close()
			if f.Machine != elf.EM_AARCH64 || f.Type != elf.ET_EXEC {
				t.Errorf("bootstrap is %v %v, want an arm64 executable", f.Machine, f.Type)
			}
			if st, err := os.Stat(filepath.Join(art, "bootstrap")); err != nil || st.Mode()&0o111 == 0 {
				t.Errorf("bootstrap is not executable (%v)", err)
			}
		})
	}
}
