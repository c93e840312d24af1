// Command token prints a buyer JWT from the dev issuer (package devauth), the
// issuer whose key `make dev` verifies with, alone on stdout:
//
//	curl -H "Authorization: Bearer $(make -s token SUB=ann)" localhost:3000/skus/demo-phone
//
// It creates the key in -dir on first use, as `make dev` does.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "token:", err)
		os.Exit(2)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sub := fs.String("sub", "", "the user (the token's sub claim)")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	dir := fs.String("dir", devauth.DefaultDir, "key directory (make dev's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sub == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: token -sub <user> [-ttl 1h] [-dir %s]", devauth.DefaultDir)
	}
	iss, err := devauth.Open(*dir)
	if err != nil {
		return err
	}
	tok, err := iss.Mint(*sub, *ttl)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, tok)
	return err
}
