// Command load fires a flash sale at holdfast and prints the invariant
// report (see package loadgen). Every simulated buyer sends its own bearer
// token, its user id as the JWT's sub. By default it targets `make dev` and
// mints the tokens with the dev issuer's key (internal/devauth, in
// .holdfast/dev/jwt; -jwt-dir to change), the key `make dev` verifies with:
//
//	go run ./cmd/load -n 2000 -c 64 -stock 150 -groups 2 -chart load.png
//
// The hot SKU's sale opens -open-after (3 s) after the buyers start: the
// first ones hear not_open, wait for the opening and try again, and the
// report counts those answers and the accepted reservations of the first
// second.
//
// Once every reservation it was told 202 for is final, it reads the events
// of its SKUs and groups from the events queue (make dev's by default, found
// as make dev finds it: HOLDFAST_EVENTS_QUEUE_URL, else .holdfast/dev/env;
// -events-queue URL another, "" none), deduplicates them by event_id and
// fails the run if a decision lacks its event or an event has no decision
// the run saw. It deletes its own events from the queue and leaves every
// other message there.
//
// Against a deployed stage, tokens come from your identity provider through
// a command run once per buyer — with the user id as its last argument, or in
// place of {user} — whose trimmed stdout is the token; admin routes are
// IAM-signed with the default AWS credentials:
//
//	go run ./cmd/load -url https://…/dev -sigv4 -token-cmd './get-token {user}'
//
// (its events go to EventBridge: -events-queue names a queue a rule
// delivers them to, or the check is skipped).
//
// -room runs the sale twice, without and then with a waiting room (-admit-factor),
// the same stock and buyers on two SKUs, and prints both reports and the
// figures side by side: reserve attempts per unit sold, the last unit's hold
// to every waiter's SOLD_OUT, units unsold while buyers waited, admission
// order against queue order, and what a poll of the public status costs
// Redis and MySQL by their own counters (make dev's, from -dev-env;
// -redis-addr and -db-dsn name others):
//
//	go run ./cmd/load -room -n 3000 -stock 300
//
// -token <JWT> sends one token for every buyer instead (the API then takes
// the user from the request body, as before per-user tokens).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ok, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (bool, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	cfg := loadgen.Config{Progress: stderr}
	fs.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:3000", "holdfast API base URL")
	fs.IntVar(&cfg.N, "n", 2000, "reservations to fire")
	fs.IntVar(&cfg.Concurrency, "c", 64, "concurrent buyers")
	fs.StringVar(&cfg.SKU, "sku", fmt.Sprintf("flash-%d", time.Now().Unix()), "hot SKU (set to this stock first)")
	fs.IntVar(&cfg.Stock, "stock", 150, "units of the hot SKU")
	fs.IntVar(&cfg.Groups, "groups", 0, "group-buy rounds (2 × capacity joiners each, some users twice)")
	fs.IntVar(&cfg.GroupCapacity, "group-capacity", 3, "slots per group")
	fs.DurationVar(&cfg.Settle, "settle", 3*time.Minute, "longest wait for every reservation to be decided")
	fs.DurationVar(&cfg.OpenAfter, "open-after", 3*time.Second, "open the hot SKU's sale window this long after the buyers start (0: open at once)")
	fs.StringVar(&cfg.Token, "token", "", "one bearer token for every buyer (instead of one per buyer)")
	tokenCmd := fs.String("token-cmd", "", "command printing a buyer's token; the user id is its last argument, or replaces {user}")
	jwtDir := fs.String("jwt-dir", devauth.DefaultDir, "dev issuer key directory to mint buyer tokens from (make dev's)")
	sigv4 := fs.Bool("sigv4", false, "sign admin requests with SigV4 (a deployed stage's IAM routes)")
	chart := fs.String("chart", "load.png", "chart file (.png or .svg); empty for none")
	fs.String("events-queue", "", "SQS queue URL the run's events reach (default: make dev's, for a loopback -url); \"\" skips the events check")
	devEnv := fs.String("dev-env", ".holdfast/dev/env", "make dev's settings file, where the default events queue is named")
	fs.DurationVar(&cfg.EventsWait, "events-wait", 2*time.Minute, "longest wait for the events once the sale settled")
	room := fs.Bool("room", false, "run the sale twice, without and with a waiting room, and compare (see -admit-factor)")
	fs.Float64Var(&cfg.AdmitFactor, "admit-factor", 1, "with -room: the waiting room's buyers admitted per unit left (1–100)")
	fs.String("redis-addr", "", "with -room: the Redis server whose INFO commandstats count a poll's commands (default: make dev's, for a loopback -url); \"\" skips")
	fs.String("db-dsn", "", "with -room: the MySQL DSN whose Questions count a poll's statements (default: make dev's, for a loopback -url); \"\" skips")
	fs.DurationVar(&cfg.PollBurst, "poll-burst", 3*time.Second, "with -room: how long the burst of polls the servers' counters measure lasts")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	var explicit, redisAddr, dbDSN *string
	fs.Visit(func(f *flag.Flag) {
		v := f.Value.String()
		switch f.Name {
		case "events-queue":
			explicit = &v
		case "redis-addr":
			redisAddr = &v
		case "db-dsn":
			dbDSN = &v
		}
	})
	if *room && cfg.Groups > 0 {
		return false, fmt.Errorf("-room sells one SKU: give -room or -groups, not both")
	}
	queueURL, skip := eventsQueueURL(explicit, cfg.BaseURL, *devEnv, os.Getenv)
	if queueURL != "" {
		q, err := eventsQueue(ctx, queueURL)
		if err != nil {
			return false, err
		}
		cfg.Events = q
	}
	cfg.EventsSkip = skip
	if cfg.Token == "" {
		tokenFor, save, err := tokenSource(ctx, *jwtDir, *tokenCmd, stderr)
		if err != nil {
			return false, err
		}
		defer func() {
			if err := save(); err != nil {
				fmt.Fprintf(stderr, "load: token cache not saved: %v\n", err)
			}
		}()
		cfg.TokenFor = tokenFor
	} else if *tokenCmd != "" {
		return false, fmt.Errorf("give -token or -token-cmd, not both")
	}
	if *sigv4 {
		sign, err := signer(ctx)
		if err != nil {
			return false, err
		}
		cfg.Sign = sign
	}
	if *room {
		counters, skip, err := serverCounters(ctx, redisAddr, dbDSN, cfg.BaseURL, *devEnv, os.Getenv)
		if err != nil {
			return false, err
		}
		if counters != nil {
			defer counters.Close()
			cfg.Counters = counters
		}
		cfg.CountersSkip = skip
		c, err := loadgen.Compare(ctx, cfg)
		if err != nil {
			return false, err
		}
		c.Print(stdout)
		if *chart != "" {
			if err := loadgen.WriteChart(c.Direct, *chart); err != nil {
				return false, err
			}
			fmt.Fprintf(stdout, "  chart    %s (the sale without the room)\n", *chart)
		}
		return c.Passed(), nil
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return false, err
	}
	rep.Print(stdout)
	if *chart != "" {
		if err := loadgen.WriteChart(rep, *chart); err != nil {
			return false, err
		}
		fmt.Fprintf(stdout, "  chart    %s\n", *chart)
	}
	return rep.Passed(), nil
}

// tokenTTL is how long a minted buyer token lives: longer than any run.
// tokenTTL is how long a minted buyer token lives; a cached one is reused
// while it has tokenReuse left (longer than any run).
const (
	tokenTTL   = 4 * time.Hour
	tokenReuse = time.Hour
)

// tokenSource returns how buyers get their tokens: from tokenCmd when given,
// else minted by the dev issuer whose key is in jwtDir (created if missing).
// loadgen asks once per user. Minted tokens are cached in jwtDir
// (load-tokens.json, by key id) and reused by the next runs while valid:
// an RSA signature per buyer is most of a short run's time. save writes the
// cache.
func tokenSource(ctx context.Context, jwtDir, tokenCmd string, stderr io.Writer) (tokenFor func(user string) (string, error), save func() error, err error) {
	if tokenCmd != "" {
		return func(user string) (string, error) { return runTokenCmd(ctx, tokenCmd, user, stderr) }, func() error { return nil }, nil
	}
	// Opened on the first token, so a run that stops at its flags leaves no key behind.
	issuer := sync.OnceValues(func() (*devauth.Issuer, error) { return devauth.Open(jwtDir) })
	cache := sync.OnceValues(func() (*tokenCache, error) {
		iss, err := issuer()
		if err != nil {
			return nil, err
		}
		return loadTokenCache(filepath.Join(jwtDir, "load-tokens.json"), iss.KeyID(), time.Now()), nil
	})
	tokenFor = func(user string) (string, error) {
		c, err := cache()
		if err != nil {
			return "", err
		}
		if tok, ok := c.get(user); ok {
			return tok, nil
		}
		iss, _ := issuer()
		tok, err := iss.Mint(user, tokenTTL)
		if err == nil {
			c.put(user, tok)
		}
		return tok, err
	}
	save = func() error {
		c, err := cache()
		if err != nil {
			return nil // nothing minted
		}
		return c.save()
	}
	return tokenFor, save, nil
}

// tokenCache is load-tokens.json: tokens minted with key KeyID, every one
// valid until at least NotAfter.
type tokenCache struct {
	KeyID    string            `json:"kid"`
	NotAfter time.Time         `json:"not_after"`
	Tokens   map[string]string `json:"tokens"`

	path  string
	mu    sync.Mutex
	dirty bool
}

// loadTokenCache returns the cache at path if it is of key kid and its
// tokens have tokenReuse left at now; else an empty one, valid until now +
// tokenTTL (the earliest expiry of what it will hold).
func loadTokenCache(path, kid string, now time.Time) *tokenCache {
	c := &tokenCache{}
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, c) == nil &&
		c.KeyID == kid && now.Add(tokenReuse).Before(c.NotAfter) && c.Tokens != nil {
		c.path = path
		return c
	}
	return &tokenCache{KeyID: kid, NotAfter: now.Add(tokenTTL), Tokens: map[string]string{}, path: path}
}

func (c *tokenCache) get(user string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tok, ok := c.Tokens[user]
	return tok, ok
}

func (c *tokenCache) put(user, tok string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Tokens[user], c.dirty = tok, true
}

func (c *tokenCache) save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := c.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.path)
}

// runTokenCmd runs command (by sh) for user — shell-quoted, in place of
// {user} (which must not sit inside quotes), else as the last argument — and
// returns its trimmed stdout.
func runTokenCmd(ctx context.Context, command, user string, stderr io.Writer) (string, error) {
	quoted := "'" + strings.ReplaceAll(user, "'", `'\''`) + "'"
	line := command + " " + quoted
	if strings.Contains(command, "{user}") {
		line = strings.ReplaceAll(command, "{user}", quoted)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("token command for %s: %w", user, err)
	}
	tok := strings.TrimSpace(string(out))
	if tok == "" {
		return "", fmt.Errorf("token command for %s printed nothing", user)
	}
	return tok, nil
}

// signer signs requests for API Gateway's IAM authorizer.
func signer(ctx context.Context) (func(*http.Request) error, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	s := v4.NewSigner()
	return func(req *http.Request) error {
		creds, err := awsCfg.Credentials.Retrieve(req.Context())
		if err != nil {
			return err
		}
		var body []byte
		if req.GetBody != nil {
			rc, err := req.GetBody()
			if err != nil {
				return err
			}
			body, _ = io.ReadAll(rc)
		}
		sum := sha256.Sum256(body)
		return s.SignHTTP(req.Context(), creds, req, hex.EncodeToString(sum[:]), "execute-api", aws.ToString(&awsCfg.Region), time.Now())
	}, nil
}
