package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/devauth"
)

// The token is alone on stdout and verifies against the key directory.
func TestPrintsOnlyAVerifiableToken(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if err := run([]string{"-sub", "ann", "-dir", dir}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if errOut.Len() != 0 || strings.Count(out.String(), "\n") != 1 || strings.Count(out.String(), ".") != 2 {
		t.Fatalf("stdout %q stderr %q, want one JWT line and nothing else", out.String(), errOut.String())
	}
	v, err := devauth.LoadVerifier(dir)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(strings.TrimSpace(out.String()))
	if err != nil || claims["sub"] != "ann" {
		t.Errorf("Verify(printed token) = %v, %v; want sub ann", claims, err)
	}
	for _, args := range [][]string{{"-dir", dir}, {"-sub", "ann", "-ttl", "0s", "-dir", dir}, {"-sub", "ann", "extra"}} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("token %v succeeded", args)
		}
	}
}
