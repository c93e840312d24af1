// Package devstacktest runs make dev's stack for a test: holdfast wired as
// the functions are, behind the local gateway on a free loopback port, with
// a dev JWT issuer, on the test's own queues and (by default) a fresh
// database of the shared services. Stopped at the end of the test.
package devstacktest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/config"
)

// Stack is a running dev stack and the issuer its gateway trusts.
type Stack struct {
	*devstack.Stack
	Issuer *devauth.Issuer
	t      testing.TB
}

// Start starts a stack with an issuer of its own; vars override its
// settings (HOLDFAST_*: another Redis, database or user claim, limits).
func Start(t testing.TB, env testservices.Env, vars map[string]string) *Stack {
	t.Helper()
	issuer, err := devauth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return StartTrusting(t, env, vars, issuer)
}

// StartTrusting starts a stack whose gateway trusts issuer's tokens (two
// stacks sharing buyers).
func StartTrusting(t testing.TB, env testservices.Env, vars map[string]string, issuer *devauth.Issuer) *Stack {
	t.Helper()
	return start(t, env, vars, issuer, false, false)
}

// StartShop starts a stack as make dev runs it, with the buyer page at
// /shop/ and the dev sign-in (POST /dev/token) of its own issuer.
func StartShop(t testing.TB, env testservices.Env, vars map[string]string) *Stack {
	t.Helper()
	issuer, err := devauth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return start(t, env, vars, issuer, false, true)
}

// StartAPIOnly starts a stack that serves the API alone, trusting issuer's
// tokens: nothing persists what it sends to its own queue, so every
// reservation it accepts stays HELD (until a sweep elsewhere decides it).
// Beside a full stack on the same Redis and database (vars), it is how a
// test holds a reservation HELD without racing persist.
func StartAPIOnly(t testing.TB, env testservices.Env, vars map[string]string, issuer *devauth.Issuer) *Stack {
	t.Helper()
	return start(t, env, vars, issuer, true, false)
}

func start(t testing.TB, env testservices.Env, vars map[string]string, issuer *devauth.Issuer, apiOnly, shop bool) *Stack {
	t.Helper()
	q := env.CreateQueues(t, env.SQS(t), 5)
	settings := map[string]string{
		"HOLDFAST_REDIS_ADDR": env.RedisAddr, "HOLDFAST_QUEUE_URL": q.URL,
		"HOLDFAST_EVENTS_QUEUE_URL": q.EventsURL, "HOLDFAST_AWS_ENDPOINT": env.SQSEndpoint, "HOLDFAST_LOG_LEVEL": "error",
		"HOLDFAST_ID_SECRET_FILE": os.Getenv("HOLDFAST_ID_SECRET_FILE"),
	}
	for k, v := range vars {
		settings[k] = v
	}
	if settings["HOLDFAST_DB_DSN"] == "" {
		settings["HOLDFAST_DB_DSN"] = env.Database(t)
	}
	cfg, err := config.Load(func(k string) string { return settings[k] })
	if err != nil {
		t.Fatal(err)
	}
	stack, err := devstack.Start(context.Background(), cfg, devstack.Options{
		Addr: "127.0.0.1:0", Template: template(), DLQURL: q.DLQURL,
		Visibility: 2 * time.Second, SweepEvery: time.Hour, Verifier: issuer.Verifier(), APIOnly: apiOnly,
		Shop: shop, SignIn: issuer,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Stop)
	return &Stack{Stack: stack, Issuer: issuer, t: t}
}

// Token mints a buyer's JWT from the stack's issuer, valid for an hour.
func (s *Stack) Token(sub string) string {
	s.t.Helper()
	tok, err := s.Issuer.Mint(sub, time.Hour)
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

// template is the repository's template.yaml, found from this file.
func template() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "template.yaml")
}
