// Package httpapi serves holdfast's HTTP API behind API Gateway (HTTP API,
// payload format 2.0). It decodes requests, calls the reservation service
// and maps results and domain errors to responses; it decides nothing.
// Errors are JSON {"error": code, "message": text}.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/reservation"
)

// MaxBody is the largest request body accepted, in bytes.
const MaxBody = 4 << 10

// Service is what the API needs of the protocol.
type Service interface {
	Reserve(ctx context.Context, req reservation.ReserveRequest) (reservation.Reservation, bool, error)
	Get(ctx context.Context, id, user string) (reservation.Reservation, error)
	Cancel(ctx context.Context, id, user string) (reservation.Reservation, error)
	Pay(ctx context.Context, id string) (reservation.Reservation, error)
	OrderCancel(ctx context.Context, id, note string) (reservation.Reservation, error)
	CreateGroup(ctx context.Context, user, sku string, capacity int, ttl time.Duration) (reservation.Group, error)
	Group(ctx context.Context, id string) (reservation.Group, error)
	SKU(ctx context.Context, sku string) (reservation.SKUState, error)
	ChangeStock(ctx context.Context, c reservation.StockChange) (reservation.StockLevel, error)
	InspectStock(ctx context.Context, sku string) (reservation.StockReport, error)
	Account(ctx context.Context, sku string) (reservation.SKUAccount, error)
	JoinQueue(ctx context.Context, user, sku string) (reservation.QueueState, error)
	QueueStatus(ctx context.Context, sku string) (reservation.QueueState, error)
	Ticket(ctx context.Context, user, sku, ticket string) (reservation.QueueState, reservation.Admission, error)
}

// Handler is the API Gateway handler of functions/reserve.
type Handler struct {
	svc   Service
	log   *slog.Logger
	claim string // the JWT claim that names the buyer
	edge  string // what EdgeHeader must say on the public status ("": anything)
}

// EdgeHeader is the header the stack's CloudFront distribution adds to every
// request it sends the API (an origin custom header, template.yaml's
// ApiCdn), with the edge secret: the public status is answered only to it,
// so polling the API's own endpoint around the CDN's cache is refused.
const EdgeHeader = "X-Holdfast-Edge"

// WithEdgeSecret makes the public status (GET /skus/{sku}/queue) answer only
// requests whose EdgeHeader is secret: the CDN's ("" answers everyone).
func WithEdgeSecret(secret string) Option {
	return func(h *Handler) { h.edge = secret }
}

// Option adjusts a Handler.
type Option func(*Handler)

// WithUserClaim names the JWT claim the buyer's id is read from ("sub" by
// default).
func WithUserClaim(name string) Option {
	return func(h *Handler) {
		if name != "" {
			h.claim = name
		}
	}
}

// hashedPrefix starts every user id derived from a claim by hashing.
const hashedPrefix = "h:"

// New returns a Handler.
func New(svc Service, log *slog.Logger, opts ...Option) *Handler {
	h := &Handler{svc: svc, log: log, claim: "sub"}
	for _, o := range opts {
		o(h)
	}
	return h
}

// caller is the buyer the verified token names: the claims API Gateway's
// JWT authorizer passes (requestContext.authorizer.jwt.claims). A claim that
// is not a valid id as such (an "auth0|…" subject, say) is mapped to one by
// a hash, the same every time, into the "h:" namespace — which a claim used
// as it is never enters (one starting "h:" is hashed too), so no buyer can
// choose a claim that names another. No identity: 401.
func (h *Handler) caller(req events.APIGatewayV2HTTPRequest) (string, response, bool) {
	var v string
	if a := req.RequestContext.Authorizer; a != nil && a.JWT != nil {
		v = a.JWT.Claims[h.claim]
	}
	if v == "" {
		resp := errorReply(http.StatusUnauthorized, "unauthenticated", "a verified token naming the buyer is required")
		resp.Headers["WWW-Authenticate"] = "Bearer"
		return "", resp, false
	}
	if reservation.ValidID(v) && !strings.HasPrefix(v, hashedPrefix) {
		return v, response{}, true
	}
	sum := sha256.Sum256([]byte(v))
	return hashedPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16])), response{}, true
}

type response = events.APIGatewayV2HTTPResponse

// route answers one route of the API; params are API Gateway's
// pathParameters, user the verified buyer ("" on the admin routes, which
// IAM guards).
type route func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, params map[string]string, user string) response

// routes are keyed by API Gateway's routeKey, as api/openapi.yaml declares
// them (a test holds the two equal). API Gateway (and make dev's gateway)
// has matched the path already: the handler reads routeKey and
// pathParameters, never the raw path or the stage.
var routes = map[string]route{
	"POST /reservations": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, _ map[string]string, user string) response {
		return h.reserve(ctx, req, user)
	},
	"GET /reservations/{id}": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, user string) response {
		r, err := h.svc.Get(ctx, p["id"], user)
		if err != nil {
			return h.fail(ctx, err)
		}
		return reply(http.StatusOK, reservationBody(r))
	},
	"DELETE /reservations/{id}": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, user string) response {
		r, err := h.svc.Cancel(ctx, p["id"], user)
		if err != nil {
			return h.fail(ctx, err)
		}
		return reply(http.StatusOK, reservationBody(r))
	},
	"POST /groups": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, _ map[string]string, user string) response {
		return h.createGroup(ctx, req, user)
	},
	"GET /groups/{id}": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		g, err := h.svc.Group(ctx, p["id"])
		if err != nil {
			return h.fail(ctx, err)
		}
		return reply(http.StatusOK, groupBody(g))
	},
	"GET /skus/{sku}": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		st, err := h.svc.SKU(ctx, p["sku"])
		if err != nil {
			return h.fail(ctx, err)
		}
		body := map[string]any{"sku": st.SKU, "available": st.Available, "server_time": timestamp(st.Now)}
		window(body, st.OpensAt, st.ClosesAt)
		if st.WaitingRoom {
			body["waiting_room"] = true
		}
		return reply(http.StatusOK, body)
	},
	// The waiting room: a buyer joins (their ticket), everyone reads the
	// queue's state (public: a CDN caches it for a second), a buyer reads
	// their ticket and, once admitted, its admission token.
	"POST /skus/{sku}/queue": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, p map[string]string, user string) response {
		return h.joinQueue(ctx, req, p["sku"], user)
	},
	publicRoute: func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		if h.edge != "" && subtle.ConstantTimeCompare([]byte(header(req, EdgeHeader)), []byte(h.edge)) != 1 {
			return noStore(errorReply(http.StatusForbidden, "edge_only", "the waiting room's status is served through the CDN (the stack's ApiUrl), not the API's own endpoint; nothing was read"))
		}
		q, err := h.svc.QueueStatus(ctx, p["sku"])
		if err != nil {
			// The same for everyone, as the status is: kept a second too, so
			// a room turned off, an unknown SKU or an outage is not every
			// waiter's poll reaching the API.
			return public(h.fail(ctx, err))
		}
		return public(reply(http.StatusOK, queueBody(q)))
	},
	"GET /skus/{sku}/queue/{ticket}": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, user string) response {
		q, a, err := h.svc.Ticket(ctx, user, p["sku"], p["ticket"])
		if err != nil {
			return noStore(h.fail(ctx, err))
		}
		return noStore(reply(http.StatusOK, ticketBody(q, a)))
	},
	"PUT /admin/skus/{sku}/stock": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		return h.setStock(ctx, req, p["sku"])
	},
	"GET /admin/skus/{sku}/stock": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		r, err := h.svc.InspectStock(ctx, p["sku"])
		if err != nil {
			return h.fail(ctx, err)
		}
		body := map[string]any{
			"sku": r.SKU, "mysql_available": r.MySQLAvailable, "redis_available": r.RedisAvailable,
			"held": r.Held, "drift": r.Drift(), "version": r.Version, "per_user_limit": r.PerUserLimit, "buckets": r.Buckets,
			"pay_within_seconds": wholeSeconds(r.PayWithin),
		}
		window(body, r.OpensAt, r.ClosesAt)
		body["waiting_room"] = r.AdmitPermille > 0
		if r.AdmitPermille > 0 {
			body["admit_factor"] = float64(r.AdmitPermille) / 1000
		}
		resp := reply(http.StatusOK, body)
		resp.Headers["ETag"] = etag(r.Version)
		return resp
	},
	"GET /admin/skus/{sku}/report": func(h *Handler, ctx context.Context, _ events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		a, err := h.svc.Account(ctx, p["sku"])
		if err != nil {
			return h.fail(ctx, err)
		}
		return reply(http.StatusOK, accountBody(a))
	},
	// The order service's routes (IAM): it records a payment, or releases a
	// reservation it will not take, for a reason code of its own.
	"POST /admin/reservations/{id}/paid": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		return h.pay(ctx, req, p["id"])
	},
	"POST /admin/reservations/{id}/cancel": func(h *Handler, ctx context.Context, req events.APIGatewayV2HTTPRequest, p map[string]string, _ string) response {
		return h.orderCancel(ctx, req, p["id"])
	},
}

// publicRoute is the one route without a caller: the waiting room's state,
// the same answer for everyone (no authorizer in api/openapi.yaml).
const publicRoute = "GET /skus/{sku}/queue"

// Routes lists the route keys the handler serves ("GET /reservations/{id}"),
// sorted.
func Routes() []string {
	out := make([]string, 0, len(routes))
	for k := range routes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Handle serves one request. It never returns an error: every failure is a
// response, so API Gateway never answers a bare 500.
func (h *Handler) Handle(ctx context.Context, req events.APIGatewayV2HTTPRequest) (response, error) {
	key := req.RouteKey
	if key == "" {
		key = req.RequestContext.RouteKey
	}
	serve, ok := routes[key]
	if !ok {
		// API Gateway invokes the function only for the document's routes.
		return errorReply(http.StatusNotFound, "not_found", "no route "+key), nil
	}
	var user string
	// Buyer routes: API Gateway's JWT authorizer (admin: IAM); the public
	// queue status names nobody.
	if !strings.Contains(key, " /admin/") && key != publicRoute {
		var resp response
		var ok bool
		if user, resp, ok = h.caller(req); !ok {
			return resp, nil
		}
	}
	return serve(h, ctx, req, req.PathParameters, user), nil
}

type reserveBody struct {
	SKU     string  `json:"sku"`
	Qty     *int    `json:"qty"`
	UserID  string  `json:"user_id"`
	GroupID *string `json:"group_id"` // nil: a buy; "" is not a group
}

func (h *Handler) reserve(ctx context.Context, req events.APIGatewayV2HTTPRequest, user string) response {
	var b reserveBody
	if resp, ok := decode(req, &b); !ok {
		return resp
	}
	switch {
	case b.SKU == "":
		return invalid("sku is required")
	case b.Qty == nil:
		return invalid("qty is required")
	case b.UserID != "" && b.UserID != user:
		// The buyer is who the token says; a body naming someone else is
		// refused, never trusted.
		return errorReply(http.StatusBadRequest, "user_mismatch", "user_id in the body is not the user the token names (leave it out)")
	case b.GroupID != nil && *b.GroupID == "":
		return invalid("group_id must name a group (leave it out to buy)")
	}
	var group string
	if b.GroupID != nil {
		group = *b.GroupID
	}
	r, replayed, err := h.svc.Reserve(ctx, reservation.ReserveRequest{
		SKU: b.SKU, Qty: *b.Qty, UserID: user, GroupID: group,
		IdempotencyKey: header(req, "Idempotency-Key"), Admission: header(req, "Admission-Token"),
	})
	if err != nil {
		return h.fail(ctx, err)
	}
	status := http.StatusAccepted
	if replayed && r.Status.Final() {
		status = http.StatusOK
	}
	return reply(status, reservationBody(r))
}

// maxTTLSeconds bounds ttl_seconds before it becomes a Duration (a year):
// anything outside 1..maxTTLSeconds is handed on as just outside it, so
// that the service refuses it naming the configured maximum.
const maxTTLSeconds = 365 * 24 * 3600

type groupRequest struct {
	SKU        string `json:"sku"`
	Capacity   *int   `json:"capacity"`
	TTLSeconds *int   `json:"ttl_seconds"`
}

func (h *Handler) createGroup(ctx context.Context, req events.APIGatewayV2HTTPRequest, user string) response {
	var b groupRequest
	if resp, ok := decode(req, &b); !ok {
		return resp
	}
	switch {
	case b.SKU == "":
		return invalid("sku is required")
	case b.Capacity == nil:
		return invalid("capacity is required")
	case b.TTLSeconds != nil && *b.TTLSeconds < 1:
		return invalid("ttl_seconds must be at least 1")
	}
	var ttl time.Duration
	if b.TTLSeconds != nil {
		ttl = time.Duration(min(*b.TTLSeconds, maxTTLSeconds+1)) * time.Second
	}
	g, err := h.svc.CreateGroup(ctx, user, b.SKU, *b.Capacity, ttl)
	if err != nil {
		return h.fail(ctx, err)
	}
	return reply(http.StatusCreated, groupBody(g))
}

type stockRequest struct {
	Stock        *int64   `json:"stock"`
	Add          *int64   `json:"add"`
	PerUserLimit *int     `json:"per_user_limit"`
	RatePerSec   *int     `json:"rate_per_second"`
	Burst        *int     `json:"burst"`
	Buckets      *int     `json:"buckets"`
	OpensAt      *string  `json:"opens_at"`
	ClosesAt     *string  `json:"closes_at"`
	PayWithin    *int64   `json:"pay_within_seconds"`
	WaitingRoom  *bool    `json:"waiting_room"`
	AdmitFactor  *float64 `json:"admit_factor"`
	Version      *int64   `json:"version"`
}

// payWithin reads pay_within_seconds into a Duration: a figure outside
// 0..MaxPayWithin is handed on as just outside it (no overflow), so that
// the service refuses it naming the bounds.
func payWithin(v *int64) *time.Duration {
	if v == nil {
		return nil
	}
	limit := int64(reservation.MaxPayWithin / time.Second)
	d := time.Duration(min(max(*v, -1), limit+1)) * time.Second
	return &d
}

// wholeSeconds is a Duration as the API writes it: whole seconds.
func wholeSeconds(d time.Duration) int64 { return int64(d / time.Second) }

// windowBound reads a sale window bound of a stock change: an RFC 3339
// time, or "" to clear it (a body member is never null).
func windowBound(name string, v *string) (*time.Time, string) {
	if v == nil {
		return nil, ""
	}
	if *v == "" {
		return &time.Time{}, ""
	}
	t, err := time.Parse(time.RFC3339, *v)
	if err != nil || t.IsZero() { // the zero time would read as "no bound": only "" clears one
		return nil, name + ` must be an RFC 3339 time such as "2026-12-01T09:00:00Z", or "" for no bound`
	}
	return &t, ""
}

// setStock changes a SKU's sellable stock: {"stock": n} is an absolute
// figure, guarded on an existing SKU by the version it was based on
// (If-Match: "<version>" or "version" in the body); {"add": n} is relative.
func (h *Handler) setStock(ctx context.Context, req events.APIGatewayV2HTTPRequest, sku string) response {
	var b stockRequest
	if resp, ok := decode(req, &b); !ok {
		return resp
	}
	if (b.Stock == nil) == (b.Add == nil) {
		return invalid("give exactly one of stock (the new figure) and add (units to add or remove)")
	}
	opens, problem := windowBound("opens_at", b.OpensAt)
	if problem != "" {
		return invalid(problem)
	}
	closes, problem := windowBound("closes_at", b.ClosesAt)
	if problem != "" {
		return invalid(problem)
	}
	c := reservation.StockChange{SKU: sku, Set: b.Stock, Add: b.Add, Limit: b.PerUserLimit, Rate: b.RatePerSec, Burst: b.Burst, IfVersion: b.Version,
		Buckets: b.Buckets, OpensAt: opens, ClosesAt: closes, PayWithin: payWithin(b.PayWithin),
		WaitingRoom: b.WaitingRoom, AdmitFactor: b.AdmitFactor, Key: header(req, "Idempotency-Key")}
	if m := strings.TrimSpace(header(req, "If-Match")); m == "*" {
		// RFC 9110: * matches any current representation: the SKU as it
		// stands, whatever its version (and 412 if there is none).
		if c.IfVersion != nil {
			return invalid("If-Match: * and the body's version disagree")
		}
		c.IfExists = true
	} else if m != "" {
		v, err := strconv.ParseInt(strings.TrimPrefix(strings.Trim(m, `"`), "W/"), 10, 64)
		if err != nil || strings.Contains(m, ",") {
			return invalid(`If-Match must be one version, as the ETag gives it ("<version>")`)
		}
		if c.IfVersion != nil && *c.IfVersion != v {
			return invalid("If-Match and the body's version disagree")
		}
		c.IfVersion = &v
	}
	level, err := h.svc.ChangeStock(ctx, c)
	if err != nil {
		return h.fail(ctx, err)
	}
	body := map[string]any{
		"sku": level.SKU, "stock": level.Available, "per_user_limit": level.PerUserLimit, "version": level.Version,
		"rate_per_second": level.UserRate, "burst": level.UserBurst, "buckets": level.BucketCount(),
		"pay_within_seconds": wholeSeconds(level.PayWithin), "waiting_room": level.WaitingRoom(),
	}
	if level.WaitingRoom() {
		body["admit_factor"] = float64(level.AdmitPermille) / 1000
	}
	window(body, level.OpensAt, level.ClosesAt)
	resp := reply(http.StatusOK, body)
	resp.Headers["ETag"] = etag(level.Version)
	return resp
}

// payRequest is POST /admin/reservations/{id}/paid's body: none, or an
// empty object (a client that always sends JSON sends {}); any member is
// refused as unknown.
type payRequest struct{}

// pay records the order service's payment of a CONFIRMED reservation:
// 200 PAID, also for a repeat.
func (h *Handler) pay(ctx context.Context, req events.APIGatewayV2HTTPRequest, id string) response {
	if resp, ok := optionalBody(req, &payRequest{}); !ok {
		return resp
	}
	r, err := h.svc.Pay(ctx, id)
	if err != nil {
		return h.fail(ctx, err)
	}
	return reply(http.StatusOK, reservationBody(r))
}

type orderCancelRequest struct {
	Reason *string `json:"reason"`
}

// orderCancel is the order service's release of a HELD or CONFIRMED
// reservation, for its reason code (kept as the row's note): 200
// CANCELLED, also for one already cancelled.
func (h *Handler) orderCancel(ctx context.Context, req events.APIGatewayV2HTTPRequest, id string) response {
	var b orderCancelRequest
	if resp, ok := decode(req, &b); !ok {
		return resp
	}
	if b.Reason == nil {
		return invalid("reason is required (the order service's reason code)")
	}
	r, err := h.svc.OrderCancel(ctx, id, *b.Reason)
	if err != nil {
		return h.fail(ctx, err)
	}
	return reply(http.StatusOK, reservationBody(r))
}

// joinRequest is POST /skus/{sku}/queue's body: none, or {} (any member is
// refused as unknown).
type joinRequest struct{}

// joinQueue gives the caller their ticket in the SKU's waiting room (the
// one they have, if any): 200 with the ticket's state. Its admission token
// comes with GET /skus/{sku}/queue/{ticket}.
func (h *Handler) joinQueue(ctx context.Context, req events.APIGatewayV2HTTPRequest, sku, user string) response {
	if resp, ok := optionalBody(req, &joinRequest{}); !ok {
		return resp
	}
	q, err := h.svc.JoinQueue(ctx, user, sku)
	if err != nil {
		return noStore(h.fail(ctx, err))
	}
	return noStore(reply(http.StatusOK, ticketBody(q, reservation.Admission{})))
}

// public marks resp as anyone's to keep for a second: the public status,
// its answer and its errors (the distribution's cache policy keeps it for
// that second at most).
func public(resp response) response {
	resp.Headers["Cache-Control"] = "public, max-age=1"
	return resp
}

// noStore marks resp as nobody's to keep: a ticket's answer (its admission
// token), and every error of the queue's routes.
func noStore(resp response) response {
	resp.Headers["Cache-Control"] = "no-store"
	return resp
}
