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
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Bodies in and out: strict JSON decoding, domain errors mapped to
// statuses and codes, and the JSON answers.

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// decode reads a JSON body strictly: bounded size, no unknown fields, one value.
func decode(req events.APIGatewayV2HTTPRequest, v any) (response, bool) {
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
		return invalid("body is required (JSON)"), false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("body is not valid JSON for this route: " + jsonProblem(err)), false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("body has data after the JSON object"), false
	}
	return response{}, true
}

func jsonProblem(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s", typeErr.Field, typeErr.Type)
	}
	return err.Error()
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
	case errors.Is(err, reservation.ErrLimitExceeded):
		return errorReply(http.StatusConflict, "limit_exceeded", "this user reached the per-user limit for the sku")
	case errors.Is(err, reservation.ErrRateLimited):
		wait := time.Second
		var rl *reservation.RateLimitedError
		if errors.As(err, &rl) && rl.RetryAfter > wait {
			wait = rl.RetryAfter
		}
		resp := errorReply(http.StatusTooManyRequests, "rate_limited", "too many attempts by this buyer on this sku; nothing was held")
		resp.Headers["Retry-After"] = strconv.Itoa(int((wait + time.Second - 1) / time.Second))
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

func reservationBody(r reservation.Reservation) map[string]any {
	m := map[string]any{"reservation_id": r.ID, "status": r.Status, "sku": r.SKU, "qty": r.Qty}
	if !r.ExpiresAt.IsZero() {
		m["expires_at"] = r.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	if r.GroupID != "" {
		m["group_id"] = r.GroupID
	}
	if r.Reason != "" {
		m["reason"] = r.Reason
	}
	return m
}

func groupBody(g reservation.Group) map[string]any {
	return map[string]any{
		"group_id": g.ID, "sku": g.SKU, "status": g.Status, "capacity": g.Capacity,
		"remaining": g.Remaining, "members": g.Members, "deadline": g.Deadline.UTC().Format(time.RFC3339Nano),
	}
}
