// Package schedule holds the handler of the sweeper, invoked by an
// EventBridge Scheduler schedule.
package schedule

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Sweeper is what the handler needs of the protocol.
type Sweeper interface {
	Sweep(ctx context.Context) (reservation.SweepReport, error)
}

// Handler runs one sweep per invocation.
type Handler struct {
	svc Sweeper
	log *slog.Logger
}

// New returns a Handler.
func New(svc Sweeper, log *slog.Logger) *Handler { return &Handler{svc: svc, log: log} }

// Handle runs a sweep. The event's content is ignored: a schedule carries
// nothing the sweep needs. An error fails the invocation (the schedule's
// retry policy and the next tick both try again).
func (h *Handler) Handle(ctx context.Context, _ json.RawMessage) (reservation.SweepReport, error) {
	rep, err := h.svc.Sweep(ctx)
	h.log.InfoContext(ctx, "sweep", "skus", rep.SKUs, "warmed", rep.Warmed, "expired", rep.Expired,
		"released", rep.Released, "confirmed", rep.Confirmed, "groups_failed", rep.GroupsFailed,
		"events_resent", rep.EventsResent, "errors", rep.Errors)
	return rep, err
}
