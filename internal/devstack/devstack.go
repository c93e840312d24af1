// Package devstack runs the four holdfast handlers on one machine the way
// Lambda runs them: an HTTP server that turns requests into API Gateway HTTP
// API v2 events for the reserve handler (answering 404 and 401 itself, as API
// Gateway's routes and JWT authorizer do), pollers that feed persist and
// compensate like Lambda's SQS event source (batch size, batching window,
// visibility timeout, partial batch responses, bounded concurrency), and the
// sweeper on its schedule. Every setting comes from template.yaml, the place
// production takes it from. `make dev` and the end-to-end test use it; make
// dev also serves the buyer page and a dev sign-in beside the API (Pages).
package devstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/internal/devsqs"
	"github.com/holdfast/holdfast/internal/eventsource"
	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/consumer"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/handlers/schedule"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Options configures a Stack. Zero values take the template's settings.
type Options struct {
	Addr         string // HTTP listen address; "127.0.0.1:0" picks a free port
	Template     string // path of template.yaml
	DLQURL       string // the reservation DLQ (compensate's source)
	CreateQueues bool   // create the queues from the template (the dev stack); tests bring their own
	Seed         map[string]int64
	Log          *slog.Logger // one readable line per request and per batch
	// Verifier checks the buyer routes' tokens in place of the template's JWT
	// authorizer (internal/devauth's; required when a route has one).
	Verifier Verifier
	// Overrides for tests: a short visibility timeout and sweep period so a
	// retried record or an expired hold does not take minutes.
	Visibility time.Duration
	SweepEvery time.Duration
	// APIOnly serves the API alone: no persist, compensate or sweeper in
	// this process (make bench measures the reserve path's CPU with it;
	// another process, or nothing, drains the queue).
	APIOnly bool
	// Shop serves the buyer page at /shop/ beside the API and, with SignIn,
	// the dev sign-in at POST /dev/token (see Pages): make dev only, neither
	// is deployed.
	Shop   bool
	SignIn Minter
}

// Stack is a running local holdfast.
type Stack struct {
	URL string // the stack's address: the CDN in front of the API
	// OriginURL is the API's own endpoint behind it (execute-api's), which
	// answers the public status only to the CDN (httpapi.EdgeHeader).
	OriginURL string
	App       *app.App
	Persist   *consumer.Handler
	Sweeper   *schedule.Handler

	cancel context.CancelFunc
	srv    *http.Server
	origin *http.Server
	wg     sync.WaitGroup
}

// Start builds holdfast from cfg (the same wiring as the functions),
// applies the migrations, seeds the demo SKUs and starts serving.
func Start(ctx context.Context, cfg config.Config, o Options) (*Stack, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.NeedsQueue(); err != nil {
		return nil, err
	}
	if o.DLQURL == "" {
		return nil, errors.New("devstack: the DLQ URL is required")
	}
	tpl, err := samtemplate.Load(o.Template)
	if err != nil {
		return nil, err
	}
	fns, queues := tpl.Functions(), tpl.Queues()
	persistEv, ok1 := fns["PersistFunction"].SQS["Reservations"]
	compEv, ok2 := fns["CompensateFunction"].SQS["DeadLetters"]
	mainQ, dlq := queues[persistEv.QueueLogicalID], queues[compEv.QueueLogicalID]
	if !ok1 || !ok2 || mainQ.LogicalID == "" || dlq.LogicalID == "" {
		return nil, errors.New("devstack: template.yaml lacks the persist or compensate SQS events")
	}
	routes, err := apiRoutes(tpl, o.Verifier)
	if err != nil {
		return nil, err
	}
	sweepEvery := o.SweepEvery
	if sweepEvery == 0 {
		if sweepEvery, err = samtemplate.Rate(fns["SweeperFunction"].Schedule); err != nil {
			return nil, err
		}
	}

	if cfg.EdgeSecret == "" {
		// The CDN and the API agree on a secret of the stack's own, as the
		// template's EdgeSecret makes them: the API's own endpoint
		// (OriginURL) answers the public status to the CDN only. The edge
		// sends cfg.EdgeSecret, so a Secrets Manager id is not read here.
		cfg.EdgeSecretID, cfg.EdgeSecret = "", rand.Text()
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "dev", Out: io.Discard})
	if err != nil {
		return nil, err
	}
	if _, err := mysqlstore.Migrate(ctx, a.DB); err != nil {
		_ = a.Close()
		return nil, err
	}
	if o.CreateQueues {
		if err := createQueues(ctx, a.SQS, cfg, o.DLQURL, mainQ, dlq); err != nil {
			_ = a.Close()
			return nil, err
		}
	}
	for sku, n := range o.Seed {
		// Only SKUs MySQL does not know: a second run keeps its data.
		if _, err := a.Service.Available(ctx, sku); !errors.Is(err, reservation.ErrUnknownSKU) {
			continue
		}
		if _, err := a.Service.ChangeStock(ctx, reservation.SetTo(sku, n)); err != nil {
			_ = a.Close()
			return nil, fmt.Errorf("seed %s: %w", sku, err)
		}
		o.Log.Info("seeded", "sku", sku, "stock", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{App: a, cancel: cancel}
	quiet := slog.New(slog.DiscardHandler)
	api := a.Handlers(o.Log).API // warnings of the API show in make dev
	h := a.Handlers(quiet)
	s.Persist, s.Sweeper = h.Persist, h.Sweeper
	compensate := h.Compensate

	vis := func(q samtemplate.Queue) int32 {
		if o.Visibility > 0 {
			return int32(o.Visibility / time.Second)
		}
		return int32(q.VisibilityTimeout)
	}
	if !o.APIOnly {
		receiver, err := devsqs.New(ctx, s.App.SQS)
		if err != nil {
			_ = s.App.Close()
			return nil, err
		}
		s.consume(ctx, o, cfg, receiver, persistEv, compEv, vis(mainQ), vis(dlq), compensate, sweepEvery)
	}

	addr := o.Addr
	if addr == "" {
		addr = "127.0.0.1:3000"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.URL = "http://" + ln.Addr().String()
	origin := Origin(api.Handle, routes, o.Verifier, o.Log)
	handler := Edge(origin, cfg.EdgeSecret, o.Log)
	if o.Shop {
		if handler, err = Pages(handler, routes, o.SignIn, o.Log); err != nil {
			_ = ln.Close()
			s.Stop()
			return nil, err
		}
	}
	s.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	oln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.OriginURL = "http://" + oln.Addr().String()
	s.origin = &http.Server{Handler: origin, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.origin.Serve(oln)
	}()
	o.Log.Info("holdfast is up", "api", s.URL, "persist_concurrency", persistEv.MaximumConcurrency,
		"batch_size", persistEv.BatchSize, "visibility_s", vis(mainQ), "sweep_every", sweepEvery)
	return s, nil
}

// consume runs persist and compensate on their queues and the sweeper on
// its schedule, as Lambda's event sources and EventBridge would.
func (s *Stack) consume(ctx context.Context, o Options, cfg config.Config, receiver eventsource.API, persistEv, compEv samtemplate.SQSEvent,
	mainVis, dlqVis int32, compensate *consumer.Handler, sweepEvery time.Duration) {
	s.poll(ctx, o.Log, "persist", receiver, cfg.QueueURL, persistEv, mainVis, s.Persist.Handle)
	s.poll(ctx, o.Log, "compensate", receiver, o.DLQURL, compEv, dlqVis, compensate.Handle)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				rep, err := s.Sweeper.Handle(ctx, json.RawMessage(`{}`))
				if err != nil || rep.Expired+rep.GroupsFailed+rep.PaymentsTimedOut+rep.Warmed+rep.EventsResent+rep.Errors > 0 {
					o.Log.Info("sweep", "expired", rep.Expired, "released", rep.Released, "groups_failed", rep.GroupsFailed,
						"payments_timed_out", rep.PaymentsTimedOut,
						"warmed", rep.Warmed, "events_resent", rep.EventsResent, "errors", rep.Errors, "error", err)
				}
			}
		}
	}()
}

// apiRoutes returns the reserve function's HTTP API routes, checking the
// gateway can authorize each as API Gateway would.
func apiRoutes(tpl *samtemplate.Template, v Verifier) ([]samtemplate.Route, error) {
	var routes []samtemplate.Route
	for _, r := range tpl.Routes() {
		if r.Function != "ReserveFunction" {
			continue
		}
		switch {
		case r.AuthType == "JWT" && v == nil:
			return nil, fmt.Errorf("devstack: route %s needs the JWT authorizer %s: Options.Verifier is required (internal/devauth)", r.Key(), r.Authorizer)
		case r.AuthType != "JWT" && r.AuthType != "AWS_IAM" && r.AuthType != "NONE":
			return nil, fmt.Errorf("devstack: route %s: the dev gateway has no %s authorizer", r.Key(), r.AuthType)
		}
		routes = append(routes, r)
	}
	if len(routes) == 0 {
		return nil, errors.New("devstack: template.yaml gives ReserveFunction no HttpApi route")
	}
	return routes, nil
}

func (s *Stack) poll(ctx context.Context, log *slog.Logger, name string, client eventsource.API, url string,
	ev samtemplate.SQSEvent, visibility int32, h eventsource.Handler) {
	p := &eventsource.Poller{
		Client: client, QueueURL: url, BatchSize: int32(ev.BatchSize), Visibility: visibility,
		Window: time.Duration(ev.MaximumBatchingWindow) * time.Second, WaitTime: 1, Handler: h,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		p.Run(ctx, ev.MaximumConcurrency, func(r eventsource.Result, err error) {
			if err != nil {
				log.Warn(name+" poll", "error", err)
				return
			}
			log.Info(name+" batch", "size", r.Received, "failures", r.Failed)
		})
	}()
}

// Stop stops serving and polling and closes the clients.
func (s *Stack) Stop() {
	s.cancel()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range []*http.Server{s.srv, s.origin} {
		if srv != nil {
			_ = srv.Shutdown(shutdown)
		}
	}
	s.wg.Wait()
	_ = s.App.Close()
}

// EnsureQueues creates the reservation queue, its DLQ and the events queue
// with template.yaml's settings (the dev stack and make bench).
func EnsureQueues(ctx context.Context, c *sqs.Client, cfg config.Config, dlqURL, template string) error {
	tpl, err := samtemplate.Load(template)
	if err != nil {
		return err
	}
	fns, queues := tpl.Functions(), tpl.Queues()
	mainQ := queues[fns["PersistFunction"].SQS["Reservations"].QueueLogicalID]
	dlq := queues[fns["CompensateFunction"].SQS["DeadLetters"].QueueLogicalID]
	return createQueues(ctx, c, cfg, dlqURL, mainQ, dlq)
}

// createQueues creates the DLQ, the reservation queue with the template's
// visibility timeout and redrive policy, and the local events queue.
func createQueues(ctx context.Context, c *sqs.Client, cfg config.Config, dlqURL string, mainQ, dlq samtemplate.Queue) error {
	create := func(url string, attrs map[string]string) error {
		_, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(path.Base(url)), Attributes: attrs})
		if err != nil {
			return fmt.Errorf("create queue %s: %w", path.Base(url), err)
		}
		return nil
	}
	if err := create(dlqURL, map[string]string{"VisibilityTimeout": fmt.Sprint(dlq.VisibilityTimeout)}); err != nil {
		return err
	}
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlqURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		return fmt.Errorf("dlq arn: %w", err)
	}
	redrive := queue.RedrivePolicy(mainQ.MaxReceiveCount, out.Attributes["QueueArn"])
	if err := create(cfg.QueueURL, map[string]string{
		"VisibilityTimeout": fmt.Sprint(mainQ.VisibilityTimeout), "RedrivePolicy": redrive,
	}); err != nil {
		return err
	}
	if cfg.EventsQueueURL != "" {
		return create(cfg.EventsQueueURL, nil)
	}
	return nil
}

// Verifier checks a bearer token as API Gateway's JWT authorizer does and
// returns its claims (internal/devauth's Verifier in `make dev`).
type Verifier interface {
	Verify(token string) (map[string]string, error)
}

// APIHandler is a Lambda handler of API Gateway HTTP API events
// (httpapi.Handler.Handle).
type APIHandler func(ctx context.Context, req events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)

// Gateway turns HTTP requests into API Gateway HTTP API v2 events, as
// `sam local start-api` does, logs one line per request, and answers what
// API Gateway answers itself, without invoking h:
//
//   - a request line plus headers over MaxRequestHead (10,240 bytes): 431
//     {"message":"Request Header Fields Too Large"};
//   - a body over MaxPayload (10 MB): 413 {"message":"Request Entity Too
//     Large"}; a smaller body, however much larger than the function takes,
//     is read whole and handed to it;
//   - a request that matches none of routes (template.yaml's): 404
//     {"message":"Not Found"};
//   - a route behind a JWT authorizer without a token in its identity header
//     ("Bearer <jwt>", or the bare token, both of which API Gateway takes),
//     or with one v rejects (signature, kid, iss, aud, exp, nbf): 401
//     {"message":"Unauthorized"}. A nil v rejects every token.
//
// A GET answered "Cache-Control: public, max-age=N" (the waiting room's
// status) is answered again from memory for up to a second, as the stack's
// CloudFront distribution does (edgeCache).
//
// Otherwise the event carries RouteKey ("GET /reservations/{id}"),
// PathParameters and, behind a JWT authorizer, the token's claims at
// RequestContext.Authorizer.JWT.Claims (Scopes nil). AWS_IAM routes (/admin)
// pass unchecked: SigV4 guards them in AWS, and the dev stack listens on
// loopback only.
func Gateway(h APIHandler, routes []samtemplate.Route, v Verifier, log *slog.Logger) http.Handler {
	return Edge(Origin(h, routes, v, log), "", log)
}

// Origin is the API's own endpoint (execute-api in AWS): Gateway without
// the CDN in front.
func Origin(h APIHandler, routes []samtemplate.Route, v Verifier, log *slog.Logger) http.Handler {
	// Routing is ServeMux's, from the document's routes (the most specific
	// pattern wins, a trailing slash is another path), as sam local
	// start-api routes; whatever matches none gets API Gateway's 404.
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		gatewayReply(w, http.StatusNotFound, "Not Found", nil)
		log.Info(r.Method+" "+r.URL.Path, "status", http.StatusNotFound, "route", "none")
	})
	for _, route := range routes {
		mux.Handle(pattern(route), invoke(h, route, v, log))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// API Gateway's quotas come before routing: the request line and
		// headers, then the payload (a body of unknown length is counted
		// as it is read, in invoke).
		if requestHeadSize(r) > MaxRequestHead {
			gatewayReply(w, http.StatusRequestHeaderFieldsTooLarge, http.StatusText(http.StatusRequestHeaderFieldsTooLarge), nil)
			log.Info(r.Method+" "+r.URL.Path, "status", http.StatusRequestHeaderFieldsTooLarge, "head_bytes", requestHeadSize(r))
			return
		}
		if r.ContentLength > MaxPayload {
			tooLarge(w, r)
			log.Info(r.Method+" "+r.URL.Path, "status", http.StatusRequestEntityTooLarge, "content_length", r.ContentLength)
			return
		}
		// API Gateway matches the path as sent: no cleaning redirects
		// (//x, /./x, /a/../x); ServeMux would answer 307 instead.
		if r.URL.Path != "/" && path.Clean(r.URL.Path) != strings.TrimSuffix(r.URL.Path, "/") || strings.Contains(r.URL.Path, "//") {
			gatewayReply(w, http.StatusNotFound, "Not Found", nil)
			log.Info(r.Method+" "+r.URL.Path, "status", http.StatusNotFound, "route", "none")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Edge is the stack's CloudFront distribution in front of origin: it keeps
// the public status (edgeCache) and sends every request on with
// httpapi.EdgeHeader set to secret, replacing what the viewer sent, as an
// origin custom header does ("" sends none).
func Edge(origin http.Handler, secret string, log *slog.Logger) http.Handler {
	return newEdgeCache(time.Now, log).wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(httpapi.EdgeHeader)
		if secret != "" {
			r.Header.Set(httpapi.EdgeHeader, secret)
		}
		origin.ServeHTTP(w, r)
	}))
}

// EdgeMaxAge is how long the stack's CloudFront distribution keeps the
// waiting room's public status (template.yaml's QueueStatusCachePolicy).
const EdgeMaxAge = time.Second

// edgeCache is what the CloudFront distribution in front of the API does
// for the waiting room's public status, kept small: a GET answered with
// Cache-Control "public, max-age=N" (N ≥ 1) is served again to every GET of
// the same path — whatever its query string, headers or cookies — for N
// seconds, at most EdgeMaxAge, and then asked of the API anew. Nothing else
// is kept (the distribution caches nothing else: CachingDisabled). As
// CloudFront collapses concurrent requests for one object, the GETs of a
// path known to be public that miss while one is asking the API wait for
// its answer instead of all reaching the API at once (a herd each second).
type edgeCache struct {
	now func() time.Time
	log *slog.Logger

	mu       sync.Mutex
	kept     map[string]keptAnswer    // by path; an expired one is kept a while, to know the path is public
	inflight map[string]chan struct{} // a public path's refresh under way: closed when it is kept
	waiting  int                      // GETs waiting on a refresh now
}

// edgeForget is how long an expired answer is remembered, for its path to
// be known public (so its concurrent misses collapse).
const edgeForget = time.Minute

type keptAnswer struct {
	status int
	header http.Header
	body   []byte
	until  time.Time
}

func newEdgeCache(now func() time.Time, log *slog.Logger) *edgeCache {
	return &edgeCache{now: now, log: log, kept: map[string]keptAnswer{}, inflight: map[string]chan struct{}{}}
}

// serve writes a kept answer.
func (c *edgeCache) serve(w http.ResponseWriter, r *http.Request, a keptAnswer, how string) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	c.log.Info(r.Method+" "+r.URL.Path, "status", a.status, "cache", how)
}

func (c *edgeCache) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			next.ServeHTTP(w, r)
			return
		}
		path := r.URL.Path
		c.mu.Lock()
		a, known := c.kept[path]
		if known && c.now().Before(a.until) {
			c.mu.Unlock()
			c.serve(w, r, a, "hit")
			return
		}
		if wait, busy := c.inflight[path]; known && busy {
			c.waiting++
			c.mu.Unlock()
			select { // another request of this public path is asking the API
			case <-wait:
			case <-r.Context().Done():
			}
			c.mu.Lock()
			c.waiting--
			a, known = c.kept[path]
			c.mu.Unlock()
			if r.Context().Err() != nil {
				return
			}
			if known && c.now().Before(a.until) {
				c.serve(w, r, a, "collapsed")
				return
			}
			next.ServeHTTP(w, r) // the refresh was not kept (an error): ask on its own
			return
		}
		var refreshed chan struct{}
		if known {
			refreshed = make(chan struct{})
			c.inflight[path] = refreshed
		}
		c.mu.Unlock()
		rec := &recording{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		c.mu.Lock()
		if ttl := publicMaxAge(w.Header().Get("Cache-Control")); ttl > 0 {
			now := c.now()
			for p, old := range c.kept {
				if now.Sub(old.until) > edgeForget {
					delete(c.kept, p)
				}
			}
			c.kept[path] = keptAnswer{status: rec.status, header: w.Header().Clone(), body: rec.body.Bytes(), until: now.Add(min(ttl, EdgeMaxAge))}
		}
		if refreshed != nil {
			delete(c.inflight, path)
			close(refreshed)
		}
		c.mu.Unlock()
	})
}

// publicMaxAge is the max-age of a Cache-Control value that says public
// (0 if it does not, or says no-store, no-cache or private).
func publicMaxAge(cc string) time.Duration {
	var public bool
	var age time.Duration
	for _, d := range strings.Split(cc, ",") {
		d = strings.ToLower(strings.TrimSpace(d))
		switch {
		case d == "public":
			public = true
		case d == "no-store" || d == "no-cache" || d == "private":
			return 0
		case strings.HasPrefix(d, "max-age="):
			if n, err := strconv.Atoi(strings.TrimPrefix(d, "max-age=")); err == nil && n > 0 {
				age = time.Duration(n) * time.Second
			}
		}
	}
	if !public {
		return 0
	}
	return age
}

// recording passes a response on and keeps a copy of its status and body.
type recording struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recording) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recording) Write(b []byte) (int, error) {
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

// invoke serves one route: the authorizer, then the function.
func invoke(h APIHandler, route samtemplate.Route, v Verifier, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		logged := func(status int, args ...any) {
			log.Info(r.Method+" "+r.URL.Path, append([]any{"status", status, "latency", time.Since(start).Round(time.Microsecond)}, args...)...)
		}
		if route.Method != "ANY" && r.Method != route.Method {
			// ServeMux lets HEAD through to a GET pattern; API Gateway has no
			// such route.
			gatewayReply(w, http.StatusNotFound, "Not Found", nil)
			logged(http.StatusNotFound, "route", "none")
			return
		}
		params := params(route, r)
		var authorizer *events.APIGatewayV2HTTPRequestContextAuthorizerDescription
		switch route.AuthType {
		case "NONE", "AWS_IAM":
		case "JWT":
			claims, err := authorize(v, r.Header.Get(route.IdentityHeader))
			if err != nil {
				challenge := `Bearer error="invalid_token"`
				if errors.Is(err, errNoToken) {
					challenge = "Bearer"
				}
				gatewayReply(w, http.StatusUnauthorized, "Unauthorized", map[string]string{"WWW-Authenticate": challenge})
				logged(http.StatusUnauthorized, "auth", err)
				return
			}
			authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
				JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: claims},
			}
		default:
			gatewayReply(w, http.StatusInternalServerError, "Internal Server Error", nil)
			logged(http.StatusInternalServerError, "auth", "the dev gateway has no "+route.AuthType+" authorizer")
			return
		}
		// The whole payload, up to API Gateway's quota, goes to the
		// function, which answers its own limit (httpapi.MaxBody: 413).
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxPayload+1))
		if err != nil {
			gatewayReply(w, http.StatusBadRequest, "Bad Request", nil)
			logged(http.StatusBadRequest, "body", err)
			return
		}
		if len(body) > MaxPayload {
			tooLarge(w, r)
			logged(http.StatusRequestEntityTooLarge, "body_bytes", ">"+fmt.Sprint(MaxPayload))
			return
		}
		headers := map[string]string{}
		for k, v := range r.Header {
			headers[strings.ToLower(k)] = strings.Join(v, ",")
		}
		ev := events.APIGatewayV2HTTPRequest{
			Version: "2.0", RouteKey: route.Key(), RawPath: r.URL.Path, RawQueryString: r.URL.RawQuery,
			Headers: headers, PathParameters: params, Body: string(body),
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				RouteKey: route.Key(), Stage: "$default", RequestID: fmt.Sprintf("dev-%d", start.UnixNano()), TimeEpoch: start.UnixMilli(),
				Authorizer: authorizer,
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
					Method: r.Method, Path: r.URL.Path, Protocol: r.Proto, SourceIP: r.RemoteAddr, UserAgent: r.UserAgent(),
				},
			},
		}
		// Lambda's invocation is not the client's connection: a client that
		// goes away mid-request does not cut the function short (a hold
		// taken is still handed to persist), and the function's own
		// Timeout bounds it.
		ctx, cancel := invocationContext(r.Context(), route.Timeout)
		resp, err := h(ctx, ev)
		cancel()
		if err != nil {
			resp = events.APIGatewayV2HTTPResponse{StatusCode: http.StatusBadGateway, Body: `{"error":"internal","message":"handler error"}`}
		}
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.WriteString(w, resp.Body)
		logged(resp.StatusCode)
	})
}

// invocationContext is a function's context for a request: the request's
// values, not its cancellation (API Gateway's invocation runs on when its
// client disconnects), with the function's Timeout as its deadline.
func invocationContext(req context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(req)
	if timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, timeout)
}

// API Gateway's quotas for an HTTP API ("Quotas for configuring and running
// an HTTP API in API Gateway"), which make dev keeps.
const (
	// MaxRequestHead is the "total combined size of request line and header
	// values", 10,240 bytes. Above it the gateway answers 431
	// {"message":"Request Header Fields Too Large"}; the function never runs.
	MaxRequestHead = 10240
	// MaxPayload is the payload quota, 10 MB. A body up to it reaches the
	// function (which answers 413 above its own, smaller limit); above it
	// the gateway answers 413 {"message":"Request Entity Too Large"}.
	// Lambda's own 6 MB limit on a synchronous invocation's event, which a
	// body of more than about 6 MB meets first in AWS, is not modelled.
	// AWS documents both quotas but not the text of either answer.
	MaxPayload = 10 << 20
)

// requestHeadSize is the request line plus every header line as sent
// ("Name: value", the Host header included, line ends not counted). It
// counts the names too, so make dev refuses no less than API Gateway does.
func requestHeadSize(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto)
	if r.Host != "" {
		n += len("Host: ") + len(r.Host)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v)
		}
	}
	return n
}

// maxDrain bounds what the gateway reads of a body it refuses as too large
// before it answers, so that a client still sending gets the 413 rather
// than a reset connection; beyond it the connection is closed.
const maxDrain = 4 * MaxPayload

// tooLarge answers API Gateway's 413 for a payload over MaxPayload, after
// reading (up to maxDrain of) the rest of the body.
func tooLarge(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxDrain))
	w.Header().Set("Connection", "close")
	gatewayReply(w, http.StatusRequestEntityTooLarge, http.StatusText(http.StatusRequestEntityTooLarge), nil)
}

// pattern turns an API Gateway route into a ServeMux pattern: "{proxy+}"
// (the rest of the path) is "{proxy...}"; ANY has no method.
func pattern(r samtemplate.Route) string {
	path := r.Path
	if strings.HasSuffix(path, "+}") {
		path = strings.TrimSuffix(path, "+}") + "...}"
	}
	if r.Method == "ANY" {
		return path
	}
	return r.Method + " " + path
}

// params reads the route's path parameters from the request ServeMux matched.
func params(r samtemplate.Route, req *http.Request) map[string]string {
	var out map[string]string
	for _, seg := range strings.Split(r.Path, "/") {
		name, ok := strings.CutPrefix(seg, "{")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "+")
		if out == nil {
			out = map[string]string{}
		}
		out[name] = req.PathValue(name)
	}
	return out
}

var errNoToken = errors.New("no token")

// authorize takes the token from an identity header value as API Gateway
// does ("Bearer <jwt>" or the bare token) and verifies it.
func authorize(v Verifier, header string) (map[string]string, error) {
	tok := strings.TrimSpace(header)
	if len(tok) >= len("Bearer ") && strings.EqualFold(tok[:len("Bearer ")], "Bearer ") {
		tok = strings.TrimSpace(tok[len("Bearer "):])
	}
	if tok == "" {
		return nil, errNoToken
	}
	if v == nil {
		return nil, errors.New("no verifier")
	}
	return v.Verify(tok)
}

// gatewayReply is an answer of API Gateway itself: {"message": "..."}.
func gatewayReply(w http.ResponseWriter, status int, message string, headers map[string]string) {
	for k, v := range headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"message": message})
	_, _ = w.Write(b)
}
