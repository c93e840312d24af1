package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Bodies in and out: strict JSON decoding, domain errors mapped to
// statuses and codes, and the JSON answers.

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// decode reads a JSON body strictly into v, a pointer to one of the
// route's body structs: bounded size, one JSON object and nothing after it,
// member names exactly as the struct's json tags spell them (case matters),
// each member at most once, no member the body does not define, valid UTF-8.
// It is the one decoder of every route's body, so what a WAF or a client
// reads in a body is the one request the handler executes. The answer
// names the problem: `unknown field "colour"`, `duplicate field "qty"`.
func decode(req events.APIGatewayV2HTTPRequest, v any) (response, bool) {
	return decodeBody(req, v, true)
}

// optionalBody is decode for a route whose body may be left out: no body
// (or only whitespace) is no member at all; a body is read as decode reads it.
func optionalBody(req events.APIGatewayV2HTTPRequest, v any) (response, bool) {
	return decodeBody(req, v, false)
}

func decodeBody(req events.APIGatewayV2HTTPRequest, v any, required bool) (response, bool) {
	body := []byte(req.Body)
	if req.IsBase64Encoded {
		var err error
		if body, err = base64.StdEncoding.DecodeString(req.Body); err != nil {
			return invalid("body is not valid base64"), false
		}
	}
	if len(body) > MaxBody {
		return errorReply(http.StatusRequestEntityTooLarge, "invalid_request",
			fmt.Sprintf("body is larger than %d bytes", MaxBody)), false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if !required {
			return response{}, true
		}
		return invalid("body is required (JSON)"), false
	}
	if err := UnmarshalBody(body, v); err != nil {
		return invalid(bodyProblem(body, err, v)), false
	}
	return response{}, true
}

// UnmarshalBody decodes a request body into v as every route does:
// encoding/json/v2's Unmarshal (member names case-sensitive, a repeated name
// refused, invalid UTF-8 refused, one value and nothing after it) refusing
// unknown members too. make bench measures it against encoding/json.
func UnmarshalBody(body []byte, v any) error {
	if name := nullMember(body); name != "" {
		return &nullError{name: name}
	}
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		// The decoder reads a top-level null as "no members"; every body
		// is an object (a route whose body may be left out leaves it out).
		return errNotObject
	}
	return jsonv2.Unmarshal(body, v, jsonv2.RejectUnknownMembers(true))
}

// errNotObject is a body that is JSON but not an object.
var errNotObject = errors.New("body must be a JSON object")

// nullError is a member given as null: no member of any body is nullable
// (api/openapi.yaml), and a null read as "absent" would be one request to a
// schema validator and another to the handler.
type nullError struct{ name string }

func (e *nullError) Error() string { return fmt.Sprintf("field %q must not be null", e.name) }

// nullMember names the first member of a top-level object whose value is
// null ("" if none, or if the body is not such an object: the decoder then
// says what is wrong). Bodies without the word pay one scan for it.
func nullMember(body []byte) string {
	if !bytes.Contains(body, []byte("null")) {
		return ""
	}
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return ""
	}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return ""
		}
		name := tok.String() // before the next call voids the token
		if dec.PeekKind() == 'n' {
			return name
		}
		if err := dec.SkipValue(); err != nil {
			return ""
		}
	}
	return ""
}

// bodyProblem says what is wrong with a body UnmarshalBody refused, naming
// the member.
func bodyProblem(body []byte, err error, v any) string {
	var null *nullError
	if errors.As(err, &null) {
		return null.Error()
	}
	if errors.Is(err, errNotObject) {
		return errNotObject.Error()
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		if errors.Is(syn.Err, jsontext.ErrDuplicateName) {
			return fmt.Sprintf("duplicate field %q: each member may appear once", syn.JSONPointer.LastToken())
		}
		if trailing(body) {
			return "body has data after the JSON object"
		}
		return "body is not valid JSON: " + syn.Err.Error()
	}
	var sem *jsonv2.SemanticError
	if errors.As(err, &sem) {
		name := sem.JSONPointer.LastToken()
		switch {
		case errors.Is(sem.Err, jsonv2.ErrUnknownName):
			if known := caseFold(v, name); known != "" {
				return fmt.Sprintf("unknown field %q (member names are case-sensitive: %q)", name, known)
			}
			return fmt.Sprintf("unknown field %q", name)
		case sem.JSONPointer == "":
			return "body must be a JSON object"
		case sem.GoType != nil:
			return fmt.Sprintf("field %q must be %s", name, kindName(sem.GoType))
		}
		return fmt.Sprintf("field %q: %v", name, sem.Err)
	}
	return "body is not valid JSON: " + err.Error()
}

// trailing reports whether body starts with one valid JSON value and has
// more than whitespace after it.
func trailing(body []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true))
	if _, err := dec.ReadValue(); err != nil {
		return false
	}
	_, err := dec.ReadToken()
	return !errors.Is(err, io.EOF)
}

// caseFold returns the member of v's struct whose name equals name but for
// case ("" if none).
func caseFold(v any, name string) string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return ""
	}
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if tag != "" && strings.EqualFold(tag, name) {
			return tag
		}
	}
	return ""
}

// kindName names a field's JSON type for a message ("an integer").
func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return "a " + t.Kind().String()
}

func header(req events.APIGatewayV2HTTPRequest, name string) string {
	for k, v := range req.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// fail maps a service error to a response.
func (h *Handler) fail(ctx context.Context, err error) response {
	var inv *reservation.InvalidError
	var cancelled *reservation.CancelledError
	switch {
	case errors.As(err, &inv):
		return invalid(inv.Error())
	case errors.Is(err, reservation.ErrSoldOut):
		return errorReply(http.StatusConflict, "sold_out", "not enough stock left")
	case errors.Is(err, reservation.ErrGroupFull):
		return errorReply(http.StatusConflict, "group_full", "the group has no free slot")
	case errors.Is(err, reservation.ErrAlreadyJoined):
		return errorReply(http.StatusConflict, "already_joined", "this user already joined the group")
	case errors.Is(err, reservation.ErrGroupClosed):
		return errorReply(http.StatusConflict, "group_closed", "the group is no longer open")
	case errors.Is(err, reservation.ErrQueueNotOpen):
		resp := errorReply(http.StatusConflict, "queue_not_open", "the waiting room of this sku opens at queue_opens_at; no ticket was given")
		var qo *reservation.QueueNotOpenError
		if errors.As(err, &qo) {
			resp = reply(http.StatusConflict, map[string]string{"error": "queue_not_open",
				"message": "the waiting room of this sku opens at queue_opens_at; no ticket was given", "queue_opens_at": timestamp(qo.OpensAt)})
			resp.Headers["Retry-After"] = seconds(max(time.Second, qo.RetryAfter)) // by Redis's clock
		} else {
			resp.Headers["Retry-After"] = "1"
		}
		return resp
	case errors.Is(err, reservation.ErrNoWaitingRoom):
		return errorReply(http.StatusNotFound, "no_waiting_room", "this sku sells without a waiting room: reserve it directly")
	case errors.Is(err, reservation.ErrUnknownTicket):
		return errorReply(http.StatusNotFound, "unknown_ticket", "no such ticket of this buyer in this sku's waiting room")
	case errors.Is(err, reservation.ErrAdmissionRequired):
		return errorReply(http.StatusForbidden, "admission_required",
			"this sku sells through its waiting room: join it (POST /skus/{sku}/queue) and send the Admission-Token your ticket gets when admitted; nothing was held")
	case errors.Is(err, reservation.ErrAdmissionInvalid):
		return errorReply(http.StatusForbidden, "admission_invalid", "the Admission-Token is not this buyer's for this sku; nothing was held")
	case errors.Is(err, reservation.ErrAdmissionExpired):
		return errorReply(http.StatusForbidden, "admission_expired", "the admission has ended (it lasts a short while, once); nothing was held")
	case errors.Is(err, reservation.ErrNotOpen):
		resp := errorReply(http.StatusConflict, "not_open", "the sale of this sku has not opened yet; nothing was held")
		wait := time.Second
		var no *reservation.NotOpenError
		if errors.As(err, &no) {
			resp = reply(http.StatusConflict, map[string]string{"error": "not_open",
				"message": "the sale of this sku opens at opens_at; nothing was held", "opens_at": timestamp(no.OpensAt)})
			wait = max(wait, no.RetryAfter)
		}
		resp.Headers["Retry-After"] = seconds(wait)
		return resp
	case errors.Is(err, reservation.ErrSaleClosed):
		return errorReply(http.StatusConflict, "sale_closed", "the sale of this sku has closed; nothing was held")
	case errors.Is(err, reservation.ErrLimitExceeded):
		return errorReply(http.StatusConflict, "limit_exceeded", "this user reached the per-user limit for the sku")
	case errors.Is(err, reservation.ErrRateLimited):
		wait := time.Second
		var rl *reservation.RateLimitedError
		if errors.As(err, &rl) && rl.RetryAfter > wait {
			wait = rl.RetryAfter
		}
		resp := errorReply(http.StatusTooManyRequests, "rate_limited", "too many attempts by this buyer on this sku; nothing was held or changed")
		resp.Headers["Retry-After"] = seconds(wait)
		return resp
	case errors.Is(err, reservation.ErrTooManyGroups):
		wait := time.Second
		var tg *reservation.TooManyGroupsError
		if errors.As(err, &tg) && tg.RetryAfter > wait {
			wait = tg.RetryAfter
		}
		resp := errorReply(http.StatusTooManyRequests, "too_many_groups", "this buyer already has the most open groups allowed on this sku; nothing was created")
		resp.Headers["Retry-After"] = seconds(wait)
		return resp
	case errors.Is(err, reservation.ErrIdempotencyMismatch):
		return errorReply(http.StatusUnprocessableEntity, "idempotency_mismatch",
			"the Idempotency-Key was already used with a different request")
	case errors.Is(err, reservation.ErrPreconditionRequired):
		return errorReply(http.StatusPreconditionRequired, "precondition_required",
			`this sku exists: send If-Match: "<version>" (the ETag of GET /admin/skus/{sku}/stock) or use {"add": n}`)
	case errors.Is(err, reservation.ErrPreconditionFailed):
		return errorReply(http.StatusPreconditionFailed, "version_mismatch",
			"the stock changed since that version: read it again, or use {\"add\": n}")
	case errors.Is(err, reservation.ErrInsufficient):
		return errorReply(http.StatusConflict, "insufficient_stock", "not that many units available to remove")
	case errors.Is(err, reservation.ErrPaid):
		return errorReply(http.StatusConflict, "paid", "the reservation is paid, which is final: it cannot be cancelled; nothing changed")
	case errors.Is(err, reservation.ErrNotConfirmed):
		resp := errorReply(http.StatusConflict, "not_confirmed",
			"MySQL has not confirmed the reservation yet (it is HELD); nothing changed: pay it once ReservationConfirmed is out")
		resp.Headers["Retry-After"] = "1"
		return resp
	case errors.As(err, &cancelled):
		return reply(http.StatusConflict, map[string]string{"error": "cancelled",
			"message": "the reservation was cancelled (reason says why); nothing changed", "reason": string(cancelled.Reason)})
	case errors.Is(err, reservation.ErrGroupNotFormed):
		return errorReply(http.StatusConflict, "group_not_formed",
			"the reservation joins a group that has not formed; nothing changed: pay it once GroupFormed is out")
	case errors.Is(err, reservation.ErrUnknownSKU):
		return errorReply(http.StatusNotFound, "unknown_sku", "no such sku")
	case errors.Is(err, reservation.ErrUnknownGroup):
		return errorReply(http.StatusNotFound, "unknown_group", "no such group")
	case errors.Is(err, reservation.ErrNotFound):
		return errorReply(http.StatusNotFound, "not_found", "no such reservation")
	case errors.Is(err, reservation.ErrUnavailable), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, reservation.ErrVersionConflict), errors.Is(err, reservation.ErrContended):
		h.log.WarnContext(ctx, "dependency unavailable", "error", err)
		resp := errorReply(http.StatusServiceUnavailable, "unavailable", "a dependency is unavailable; retry later, with the same Idempotency-Key if you sent one (it is never taken twice)")
		resp.Headers["Retry-After"] = "1"
		return resp
	}
	h.log.ErrorContext(ctx, "internal error", "error", err)
	return errorReply(http.StatusInternalServerError, "internal", "internal error")
}

// seconds is a Retry-After: whole seconds, rounded up.
func seconds(d time.Duration) string { return strconv.Itoa(int((d + time.Second - 1) / time.Second)) }

// timestamp is a time as every answer writes it: RFC 3339 in UTC.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// window adds a SKU's sale window to body: opens_at and closes_at, each
// only when the window has that bound.
func window(body map[string]any, opens, closes time.Time) {
	if !opens.IsZero() {
		body["opens_at"] = timestamp(opens)
	}
	if !closes.IsZero() {
		body["closes_at"] = timestamp(closes)
	}
}

func invalid(msg string) response {
	return errorReply(http.StatusBadRequest, "invalid_request", msg)
}

func errorReply(status int, code, msg string) response {
	return reply(status, map[string]string{"error": code, "message": msg})
}

func reply(status int, body any) response {
	b, err := json.Marshal(body)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal","message":"encoding failed"}`)
	}
	return response{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": "application/json"},
		Body:       string(b),
	}
}

// reservationBody is a reservation as every route answers it: its status
// as shown (PAID for a paid CONFIRMED row), and each optional member only
// when set: the hold's deadline, the group, why it was cancelled and the
// order service's note on its cancel, when its payment is due and when it
// was paid.
func reservationBody(r reservation.Reservation) map[string]any {
	m := map[string]any{"reservation_id": r.ID, "status": r.Shown(), "sku": r.SKU, "qty": r.Qty}
	if !r.ExpiresAt.IsZero() {
		m["expires_at"] = timestamp(r.ExpiresAt)
	}
	if r.GroupID != "" {
		m["group_id"] = r.GroupID
	}
	if r.Reason != "" {
		m["reason"] = r.Reason
	}
	if r.Note != "" {
		m["note"] = r.Note
	}
	if !r.PayBy.IsZero() {
		m["pay_by"] = timestamp(r.PayBy)
	}
	if !r.PaidAt.IsZero() {
		m["paid_at"] = timestamp(r.PaidAt)
	}
	return m
}

func groupBody(g reservation.Group) map[string]any {
	return map[string]any{
		"group_id": g.ID, "sku": g.SKU, "status": g.Status, "capacity": g.Capacity,
		"remaining": g.Remaining, "members": g.Members, "deadline": g.Deadline.UTC().Format(time.RFC3339Nano),
	}
}

// accountBody is GET /admin/skus/{sku}/report's answer.
func accountBody(a reservation.SKUAccount) map[string]any {
	t := a.Tally
	rows := func(rs []reservation.RowTally, key func(reservation.RowTally) (string, string)) []map[string]any {
		out := make([]map[string]any, 0, len(rs))
		for _, r := range rs {
			name, value := key(r)
			out = append(out, map[string]any{name: value, "count": r.Count, "units": r.Units})
		}
		return out
	}
	body := map[string]any{
		"sku": t.SKU, "put_in": t.PutIn, "mysql_available": t.Available, "redis_available": a.Stock.RedisAvailable,
		"sold": t.Taken(), "paid": t.Paid(), "returned": t.Returned(), "held": a.Stock.Held, "in_transfer": t.InTransfer,
		"drift": a.Stock.Drift(), "ledger_mismatch": t.Mismatch(),
		"by_status": rows(t.ByStatus(), func(r reservation.RowTally) (string, string) { return "status", string(r.Status) }),
		"by_reason": rows(t.ByReason(), func(r reservation.RowTally) (string, string) { return "reason", string(r.Reason) }),
	}
	if a.Audited {
		la := a.LastAudit
		body["last_audit"] = map[string]any{
			"at": timestamp(la.At), "clean": la.Clean(), "ledger_mismatch": la.Mismatch, "drift": la.Drift,
			"put_in": la.PutIn, "mysql_available": la.Available, "sold": la.Taken,
		}
	}
	return body
}

// queueBody is a waiting room's state for everyone (GET
// /skus/{sku}/queue): the same answer whoever asks.
func queueBody(q reservation.QueueState) map[string]any {
	body := map[string]any{
		"sku": q.SKU, "server_time": timestamp(q.Now), "open": q.Open(),
		"admitted_through": q.Through, "length": q.Length, "sold_out": q.SoldOut(), "may_return": q.MayReturn(),
	}
	window(body, q.OpensAt, q.ClosesAt)
	return body
}

// ticketBody is a buyer's ticket (POST /skus/{sku}/queue and GET
// /skus/{sku}/queue/{ticket}): the queue's state, the ticket's place (from
// the opening on) and, when ADMITTED and a is set, its admission token.
func ticketBody(q reservation.QueueState, a reservation.Admission) map[string]any {
	body := queueBody(q)
	body["ticket"], body["status"] = q.Ticket, string(q.State)
	if q.Position > 0 {
		body["position"] = q.Position
	}
	if q.State == reservation.TicketAdmitted && a.Token != "" {
		body["admission_token"], body["admission_expires_at"] = a.Token, timestamp(a.Expires)
	}
	return body
}
