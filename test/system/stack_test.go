package system_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/eventsource"
	"github.com/holdfast/holdfast/internal/testkit/apievent"
	"github.com/holdfast/holdfast/internal/testkit/eventschema"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/consumer"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/handlers/schedule"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// testClock is a clock the test moves. Redis scripts get their time from it too.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// stack is holdfast wired exactly as the Lambda functions wire it, on the
// real local Redis, MariaDB and SQS server, with a movable clock.
type stack struct {
	t          *testing.T
	app        *app.App
	api        *httpapi.Handler
	persist    *consumer.Handler
	compensate *consumer.Handler
	sweeper    *schedule.Handler
	clock      *testClock
	sqs        *sqs.Client
	queues     testservices.Queues
	rdb        *redis.Client        // straight to Redis, past any fault proxy
	cluster    *redis.ClusterClient // straight to the Redis Cluster, when the stack runs on one (withCluster)
	db         *sql.DB              // straight to MariaDB, past any fault proxy
	cfg        config.Config
	env        testservices.Env
	idSecret   []byte // the key of ids derived from an Idempotency-Key
}

// twin builds a second service on the same stores with its own clock, as
// another Lambda execution environment would be. Redis's clock (the
// scripts') stays the stack's.
func (s *stack) twin(clock reservation.Clock, enq reservation.Enqueuer) *reservation.Service {
	s.t.Helper()
	a, err := app.Build(context.Background(), s.cfg, app.Options{Function: "twin", Out: io.Discard, Clock: clock, ScriptClock: s.clock,
		Enqueuer: func(real reservation.Enqueuer) reservation.Enqueuer {
			if enq != nil {
				return enq
			}
			return real
		}})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = a.Close() })
	return a.Service
}

// check runs the invariant checker on the stores.
func (s *stack) check(e invariant.Expect) {
	s.t.Helper()
	vs, err := invariant.Check(context.Background(), s.db, redisstore.New(s.redis(), 0), e)
	if err != nil {
		s.t.Fatalf("invariant check: %v", err)
	}
	if len(vs) > 0 {
		s.t.Errorf("invariants broken:\n%s", invariant.Violations(vs))
	}
}

// stackOption adjusts a stack before it is built: the app options and the
// environment variables config.Load reads.
type stackOption func(s *stack, o *app.Options, vars map[string]string)

// withEnqueuer replaces the SQS publisher.
func withEnqueuer(e reservation.Enqueuer) stackOption {
	return func(_ *stack, o *app.Options, _ map[string]string) {
		o.Enqueuer = func(reservation.Enqueuer) reservation.Enqueuer { return e }
	}
}

// withFailingSend makes every send report failure; delivered says whether
// the message reached the queue anyway (a send that timed out).
func withFailingSend(delivered bool) stackOption {
	return func(_ *stack, o *app.Options, _ map[string]string) {
		o.Enqueuer = func(real reservation.Enqueuer) reservation.Enqueuer {
			if delivered {
				return failingEnqueuer{next: real}
			}
			return failingEnqueuer{}
		}
	}
}

// withHooks installs crash points.
func withHooks(h reservation.Hooks) stackOption {
	return func(_ *stack, o *app.Options, _ map[string]string) { o.Hooks = h }
}

// withVars overrides settings.
func withVars(kv map[string]string) stackOption {
	return func(_ *stack, _ *app.Options, vars map[string]string) {
		for k, v := range kv {
			vars[k] = v
		}
	}
}

// withRedis points the stack at a Redis of the test's own; the test reads it directly.
func withRedis(addr string) stackOption {
	return func(s *stack, _ *app.Options, vars map[string]string) {
		vars["HOLDFAST_REDIS_ADDR"] = addr
		s.rdb = redis.NewClient(&redis.Options{Addr: addr})
		s.t.Cleanup(func() { _ = s.rdb.Close() })
	}
}

// withCluster runs the stack on a three-master Redis Cluster (seeds addrs,
// from testservices.StartCluster); the test reads it through s.cluster.
func withCluster(addrs []string) stackOption {
	return func(s *stack, _ *app.Options, vars map[string]string) {
		vars["HOLDFAST_REDIS_ADDR"] = strings.Join(addrs, ",")
		vars["HOLDFAST_REDIS_CLUSTER"] = "true"
		s.cluster = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		s.t.Cleanup(func() { _ = s.cluster.Close() })
	}
}

// withRedisProxy puts a fault proxy between holdfast and Redis.
func withRedisProxy(p **faultproxy.Proxy) stackOption {
	return func(s *stack, _ *app.Options, vars map[string]string) {
		proxy, err := faultproxy.Start(vars["HOLDFAST_REDIS_ADDR"])
		if err != nil {
			s.t.Fatal(err)
		}
		s.t.Cleanup(proxy.Close)
		vars["HOLDFAST_REDIS_ADDR"] = proxy.Addr()
		*p = proxy
	}
}

// withDBProxy puts a fault proxy between holdfast and MariaDB.
func withDBProxy(p **faultproxy.Proxy) stackOption {
	return func(s *stack, _ *app.Options, vars map[string]string) {
		cfg, err := mysql.ParseDSN(vars["HOLDFAST_DB_DSN"])
		if err != nil {
			s.t.Fatal(err)
		}
		proxy, err := faultproxy.Start(cfg.Addr)
		if err != nil {
			s.t.Fatal(err)
		}
		s.t.Cleanup(proxy.Close)
		cfg.Addr = proxy.Addr()
		cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
		vars["HOLDFAST_DB_DSN"] = cfg.FormatDSN()
		*p = proxy
	}
}

func newStack(t *testing.T, opts ...stackOption) *stack {
	t.Helper()
	env := testservices.Require(t)
	s := &stack{t: t, clock: &testClock{now: time.Now().UTC().Truncate(time.Millisecond)}}
	s.rdb = env.Redis(t)
	s.sqs = env.SQS(t)
	s.env = env
	s.queues = env.CreateQueues(t, s.sqs, 3)
	t.Cleanup(func() { s.drain() }) // every event the test emitted meets its schema
	dsn := env.Database(t)
	vars := map[string]string{
		"HOLDFAST_REDIS_ADDR":       env.RedisAddr,
		"HOLDFAST_DB_DSN":           dsn,
		"HOLDFAST_DB_MAX_OPEN":      "32",
		"HOLDFAST_QUEUE_URL":        s.queues.URL,
		"HOLDFAST_EVENTS_QUEUE_URL": s.queues.EventsURL,
		"HOLDFAST_HOLD_TTL":         "60s",
		"HOLDFAST_SWEEP_GRACE":      "2s",
		"HOLDFAST_LOG_LEVEL":        "warn",
		// Time only moves when a test moves it, so per-user attempt budgets
		// would never refill: off here, on in the tests of the limit.
		"HOLDFAST_USER_RATE":      "0",
		"HOLDFAST_ID_SECRET_FILE": s.writeIDSecret(),
	}
	o := app.Options{Function: "test", Out: io.Discard, Clock: s.clock, ScriptClock: s.clock}
	for _, opt := range opts {
		opt(s, &o, vars)
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	s.cfg = cfg
	direct, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	a, err := app.Build(context.Background(), cfg, o)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	s.app = a
	s.db = direct
	h := a.Handlers(nil)
	s.api, s.persist, s.compensate, s.sweeper = h.API, h.Persist, h.Compensate, h.Sweeper
	return s
}

// writeIDSecret makes the stack's id key: random, in a file of the test's.
func (s *stack) writeIDSecret() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	s.idSecret = []byte(hex.EncodeToString(b[:]))
	path := filepath.Join(s.t.TempDir(), "id-secret")
	if err := os.WriteFile(path, s.idSecret, 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// call sends one API Gateway HTTP API v2 request through the reserve handler,
// as the buyer it concerns (see caller): the claims API Gateway's JWT
// authorizer would pass.
func (s *stack) call(method, path, body string, headers map[string]string) (int, map[string]any) {
	s.t.Helper()
	return s.callAs(s.caller(method, path, body), method, path, body, headers)
}

// callAs sends one request as user ("" for none: no verified token).
func (s *stack) callAs(user, method, path, body string, headers map[string]string) (int, map[string]any) {
	s.t.Helper()
	resp, err := s.api.Handle(context.Background(), apiRequest(user, method, path, body, headers))
	if err != nil {
		s.t.Fatalf("%s %s: handler error %v", method, path, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
		s.t.Fatalf("%s %s: body %q is not JSON: %v", method, path, resp.Body, err)
	}
	return resp.StatusCode, m
}

// apiRequest is the v2 event API Gateway passes for a request, with the
// claims of user's verified token (none when user is "").
func apiRequest(user, method, path, body string, headers map[string]string) events.APIGatewayV2HTTPRequest {
	ev := apievent.New(method, path, body, headers)
	if user != "" {
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": user}},
		}
	}
	return ev
}

// caller is the buyer a test request concerns: the body's user_id for a
// reserve, the owner of the reservation for GET/DELETE (read from the
// stores), a fixed tester otherwise. Tests that check who may do what call
// callAs.
func (s *stack) caller(method, path, body string) string {
	return ownerOf(s.db, s.redis(), method, path, body)
}

// redis is the stack's Redis: the cluster when it runs on one.
func (s *stack) redis() redis.UniversalClient {
	if s.cluster != nil {
		return s.cluster
	}
	return s.rdb
}

func ownerOf(db *sql.DB, rdb redis.UniversalClient, method, path, body string) string {
	if method == "POST" && path == "/reservations" {
		var b struct {
			UserID string `json:"user_id"`
		}
		if json.Unmarshal([]byte(body), &b) == nil && b.UserID != "" {
			return b.UserID
		}
	}
	if id, ok := strings.CutPrefix(path, "/reservations/"); ok {
		var user string
		if db.QueryRow(`SELECT user_id FROM reservations WHERE reservation_id = ?`, id).Scan(&user) == nil {
			return user
		}
		if sku, ok := reservation.SKUOf(id); ok {
			k := 1
			_ = db.QueryRow(`SELECT buckets FROM product_stock WHERE sku = ?`, sku).Scan(&k)
			for b := range k {
				if u, err := rdb.HGet(context.Background(), "hf:{"+reservation.BucketName(sku, b)+"}:r:"+id, "user").Result(); err == nil {
					return u
				}
			}
		}
	}
	return "tester"
}

// setStock sets a SKU's stock through the admin API, with the version
// precondition when the SKU exists.
func (s *stack) setStock(sku string, n int) {
	s.t.Helper()
	var h map[string]string
	if code, body := s.call("GET", "/admin/skus/"+sku+"/stock", "", nil); code == 200 {
		h = map[string]string{"If-Match": `"` + itoa(int(body["version"].(float64))) + `"`}
	}
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":`+itoa(n)+`}`, h); code != 200 {
		s.t.Fatalf("set stock %s = %d: %d %v", sku, n, code, body)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func (s *stack) reserve(sku, user string, qty int, key string) (int, map[string]any) {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"sku": sku, "qty": qty, "user_id": user})
	var h map[string]string
	if key != "" {
		h = map[string]string{"Idempotency-Key": key}
	}
	return s.call("POST", "/reservations", string(body), h)
}

func (s *stack) join(sku, group, user string) (int, map[string]any) {
	s.t.Helper()
	return s.joinKeyed(sku, group, user, "")
}

// joinKeyed is join with an Idempotency-Key ("" for none).
func (s *stack) joinKeyed(sku, group, user, key string) (int, map[string]any) {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"sku": sku, "qty": 1, "user_id": user, "group_id": group})
	var h map[string]string
	if key != "" {
		h = map[string]string{"Idempotency-Key": key}
	}
	return s.call("POST", "/reservations", string(body), h)
}

// redisStock returns the Redis figures of a SKU: available and held.
func (s *stack) redisStock(sku string) (int64, int64) {
	s.t.Helper()
	avail, err := s.rdb.Get(context.Background(), "hf:{"+sku+"}:stock").Int64()
	if err != nil {
		s.t.Fatalf("redis stock %s: %v", sku, err)
	}
	held, err := s.rdb.HGet(context.Background(), "hf:{"+sku+"}:meta", "held").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.t.Fatalf("redis held %s: %v", sku, err)
	}
	return avail, held
}

// mysqlAvailable returns MySQL's available units of a SKU.
func (s *stack) mysqlAvailable(sku string) int64 {
	s.t.Helper()
	var n int64
	if err := s.db.QueryRow(`SELECT available FROM product_stock WHERE sku = ?`, sku).Scan(&n); err != nil {
		s.t.Fatalf("mysql available %s: %v", sku, err)
	}
	return n
}

// count runs a COUNT/SUM query returning one integer.
func (s *stack) count(q string, args ...any) int64 {
	s.t.Helper()
	var n sql.NullInt64
	if err := s.db.QueryRow(q, args...).Scan(&n); err != nil {
		s.t.Fatalf("%s: %v", q, err)
	}
	return n.Int64
}

// runPersist runs persist as Lambda's event source would (concurrent
// batches, visibility timeout 1 s so failed records come back quickly) until
// the returned stop is called.
func (s *stack) runPersist(concurrency int) (stop func()) {
	return s.run(s.queues.URL, s.queues.ARN, s.persist.Handle, concurrency)
}

func (s *stack) runCompensate() (stop func()) {
	return s.run(s.queues.DLQURL, s.queues.DLQARN, s.compensate.Handle, 1)
}

func (s *stack) run(url, arn string, h eventsource.Handler, concurrency int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	p := &eventsource.Poller{Client: s.sqs, QueueURL: url, QueueARN: arn, BatchSize: 10, Visibility: 1, WaitTime: 1, Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx, concurrency, nil)
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	s.t.Cleanup(stop)
	return stop
}

// sweep runs one sweep through the sweeper handler.
func (s *stack) sweep() reservation.SweepReport {
	s.t.Helper()
	rep, err := s.sweeper.Handle(context.Background(), json.RawMessage(`{}`))
	if err != nil {
		s.t.Fatalf("sweep: %v", err)
	}
	return rep
}

// events returns the cancellation events published since the last drain
// (drain: every event, each validated against its schema in api/events).
func (s *stack) events() []eventbus.Envelope {
	s.t.Helper()
	var out []eventbus.Envelope
	for _, e := range s.drain() {
		if e.DetailType == eventbus.DetailTypeCancelled {
			out = append(out, e)
		}
	}
	return out
}

// drain receives every event published so far, validates each against the
// JSON Schema of its detail-type, and returns them in the order received.
// Each stack drains what is left when its test ends, so every event the
// system tests emit is validated.
func (s *stack) drain() []eventbus.Envelope {
	s.t.Helper()
	var out []eventbus.Envelope
	for {
		res, err := s.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(s.queues.EventsURL), MaxNumberOfMessages: 10,
		})
		if err != nil {
			s.t.Fatalf("receive events: %v", err)
		}
		if len(res.Messages) == 0 {
			return out
		}
		for _, m := range res.Messages {
			body := []byte(aws.ToString(m.Body))
			var raw struct {
				DetailType string          `json:"detail-type"`
				Detail     json.RawMessage `json:"detail"`
			}
			var e eventbus.Envelope
			if err := json.Unmarshal(body, &raw); err != nil {
				s.t.Fatalf("event %s: %v", body, err)
			}
			if err := eventschema.Validate(raw.DetailType, raw.Detail); err != nil {
				s.t.Errorf("event against api/events: %v", err)
			}
			if err := json.Unmarshal(body, &e); err != nil {
				s.t.Fatalf("event %s: %v", body, err)
			}
			out = append(out, e)
			_, _ = s.sqs.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(s.queues.EventsURL), ReceiptHandle: m.ReceiptHandle})
		}
	}
}

// queueDepth returns the approximate number of messages in a queue.
func (s *stack) queueDepth(url string) int {
	s.t.Helper()
	out, err := s.sqs.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		s.t.Fatalf("queue attributes: %v", err)
	}
	n := 0
	_ = json.Unmarshal([]byte(out.Attributes["ApproximateNumberOfMessages"]), &n)
	return n
}

// sendRaw puts a raw body on a queue, as a duplicate delivery or a poison message would arrive.
func (s *stack) sendRaw(url, body string) {
	s.t.Helper()
	if _, err := s.sqs.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(body)}); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

// lostEnqueuer accepts every reservation and sends nothing: the message is lost.
type lostEnqueuer struct{}

func (lostEnqueuer) Enqueue(context.Context, reservation.Reservation) error { return nil }

// failingEnqueuer sends through next (when not nil) and then reports failure,
// like a send that timed out after SQS stored the message.
type failingEnqueuer struct {
	next reservation.Enqueuer
}

func (f failingEnqueuer) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if f.next != nil {
		if err := f.next.Enqueue(ctx, r); err != nil {
			return err
		}
	}
	return reservation.Unavailable("sqs send", errors.New("injected: connection reset"))
}

// recordingEnqueuer keeps the message bodies instead of sending them.
type recordingEnqueuer struct {
	mu   sync.Mutex
	msgs []reservation.Reservation
}

func (r *recordingEnqueuer) Enqueue(_ context.Context, res reservation.Reservation) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, res)
	r.mu.Unlock()
	return nil
}
