// Package provision prepares the database a stage runs on, as a CloudFormation
// custom resource: on Create and Update it applies the schema migrations and
// ensures the functions' least-privilege user; on Delete it does nothing (the
// data outlives the stack). Whatever happens, it answers CloudFormation's
// pre-signed response URL before the function's deadline, so a failed deploy
// fails in seconds instead of hanging for an hour.
//
// Invoked directly (any event that is not a custom resource request, e.g.
// `aws lambda invoke` with {}), it prepares the database and returns the
// report: the operator's way to re-run migrations.
package provision

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
)

// Report is what preparing the database did.
type Report struct {
	Database      string `json:"database"`
	SchemaVersion int    `json:"schema_version"` // the newest migration the database has
	Applied       []int  `json:"applied"`        // migrations this run applied
	AppUser       string `json:"app_user"`       // the functions' user, ensured
}

// Prepare creates what is missing: the database, its schema, the app user.
// It must be safe to run any number of times.
type Prepare func(ctx context.Context) (Report, error)

// Handler answers custom resource requests (and direct invocations).
type Handler struct {
	prepare Prepare
	client  *http.Client
	log     *slog.Logger
	// margin is kept free before the function's deadline to answer
	// CloudFormation after preparing failed or ran out of time.
	margin time.Duration
}

// NewHandler returns the handler of the migrate function.
func NewHandler(prepare Prepare, log *slog.Logger) *Handler {
	return &Handler{prepare: prepare, client: &http.Client{Timeout: 10 * time.Second}, log: log, margin: 15 * time.Second}
}

// maxReason bounds the reason sent to CloudFormation, before encoding.
const maxReason = 1024

// maxAnswer is CloudFormation's limit on the whole answer, in bytes.
const maxAnswer = 4096

// encode marshals the answer, shortening the reason until it fits in
// maxAnswer: JSON escapes <, > and & to six bytes each, so a capped reason
// can still grow past the limit.
func encode(resp *cfn.Response) ([]byte, error) {
	for {
		body, err := json.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("encode response: %w", err)
		}
		if len(body) <= maxAnswer || resp.Reason == "" {
			return body, nil
		}
		r := []rune(resp.Reason)
		resp.Reason = string(r[:len(r)/2]) + "…"
	}
}

// Handle runs one invocation.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (any, error) {
	var ev cfn.Event
	if err := json.Unmarshal(raw, &ev); err != nil || ev.RequestType == "" || ev.ResponseURL == "" {
		// A direct invocation: prepare and report, or fail the invocation.
		rep, err := h.prepare(ctx)
		if err != nil {
			return nil, err
		}
		return rep, nil
	}
	resp := cfn.NewResponse(&ev)
	resp.PhysicalResourceID = ev.PhysicalResourceID
	if resp.PhysicalResourceID == "" {
		// Stable across updates: CloudFormation never replaces the resource,
		// so it never sends a Delete for an old one.
		resp.PhysicalResourceID = "holdfast-schema-" + ev.LogicalResourceID
	}
	log := h.log.With("request_type", string(ev.RequestType), "logical_id", ev.LogicalResourceID, "request_id", ev.RequestID)

	switch ev.RequestType {
	case cfn.RequestDelete:
		// The database, its data and its users stay: the cluster's own
		// deletion policy decides their fate, not this resource.
		resp.Status = cfn.StatusSuccess
	case cfn.RequestCreate, cfn.RequestUpdate:
		work, cancel := h.workContext(ctx)
		rep, err := h.prepare(work)
		cancel()
		if err != nil {
			log.Error("prepare database failed", "error", err)
			resp.Status, resp.Reason = cfn.StatusFailed, reason(err)
			break
		}
		log.Info("database prepared", "database", rep.Database, "schema_version", rep.SchemaVersion, "applied", rep.Applied)
		resp.Status = cfn.StatusSuccess
		resp.Data = map[string]any{
			"Database":      rep.Database,
			"SchemaVersion": strconv.Itoa(rep.SchemaVersion),
			"AppUser":       rep.AppUser,
		}
	default:
		resp.Status, resp.Reason = cfn.StatusFailed, fmt.Sprintf("unknown request type %q", ev.RequestType)
	}
	if err := h.respond(ctx, resp, ev.ResponseURL); err != nil {
		log.Error("could not answer CloudFormation", "error", err)
		return nil, err
	}
	return map[string]string{"Status": string(resp.Status)}, nil
}

// workContext leaves margin before the invocation's deadline for the answer.
func (h *Handler) workContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, d.Add(-h.margin))
	}
	return context.WithCancel(ctx)
}

func reason(err error) string {
	s := err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		s = "the database did not become ready in time (is the proxy's target available?): " + s
	}
	if len(s) > maxReason {
		s = s[:maxReason] + "…"
	}
	return s + " (see the migrate function's log)"
}

// respond PUTs the answer to the pre-signed URL, retrying briefly: a lost
// answer leaves the stack waiting for the resource's ServiceTimeout.
func (h *Handler) respond(ctx context.Context, resp *cfn.Response, url string) error {
	body, err := encode(resp)
	if err != nil {
		return err
	}
	var last error
	for attempt := range 4 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(last, ctx.Err())
			case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("response url: %w", err)
		}
		// The URL is signed for no content type; S3 refuses one it did not sign.
		req.Header.Del("Content-Type")
		req.ContentLength = int64(len(body))
		res, err := h.client.Do(req)
		if err != nil {
			last = err
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		_ = res.Body.Close()
		if res.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("response url answered %s: %s", res.Status, strings.TrimSpace(string(msg)))
		if res.StatusCode < 500 {
			return last // a refused signature does not get better
		}
	}
	return last
}
