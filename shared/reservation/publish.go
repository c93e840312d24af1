package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// publish carries out the events MySQL's outbox holds unpublished for the
// aggregates named (a decision just wrote them): each goes out, then is
// marked published. Best effort: what fails waits for the sweeper's drain
// (drainEvents), and a decision stands either way, so it only logs.
func (s *Service) publish(ctx context.Context, aggregates ...string) {
	if len(aggregates) == 0 {
		return
	}
	evs, err := s.ledger.EventsOf(ctx, aggregates)
	if err == nil {
		_, err = s.send(ctx, evs)
	}
	if err != nil {
		s.metrics.Count("events_unpublished", 1)
		s.log.WarnContext(ctx, "events not published yet; the sweeper publishes them", "aggregates", len(aggregates), "error", err)
	}
}

// sendWritten publishes events a decision just committed to the outbox,
// as it wrote them, without reading them back; like publish, best effort.
func (s *Service) sendWritten(ctx context.Context, evs []Event) {
	if len(evs) == 0 {
		return
	}
	if _, err := s.send(ctx, evs); err != nil {
		s.metrics.Count("events_unpublished", 1)
		s.log.WarnContext(ctx, "events not published yet; the sweeper publishes them", "events", len(evs), "error", err)
	}
}

// send publishes evs (in the outbox's order) and marks those the bus took.
// An aggregate's event goes out only after its earlier one was taken: each
// round sends the first unsent event of each aggregate, and an aggregate
// whose event failed waits for the next drain. It returns how many went out.
func (s *Service) send(ctx context.Context, evs []Event) (int, error) {
	sent := 0
	var errs []error
	blocked := map[string]bool{}
	for len(evs) > 0 {
		var round, rest []Event
		in := map[string]bool{}
		for _, e := range evs {
			switch {
			case blocked[e.AggregateID]:
			case in[e.AggregateID]:
				rest = append(rest, e)
			default:
				in[e.AggregateID] = true
				round = append(round, e)
			}
		}
		if len(round) == 0 {
			break
		}
		perr := s.notifier.Publish(ctx, round)
		out := make([]Event, 0, len(round))
		for i, e := range round {
			if perr[i] != nil {
				blocked[e.AggregateID] = true
				errs = append(errs, fmt.Errorf("publish %s: %w", e.ID, perr[i]))
				continue
			}
			out = append(out, e)
		}
		if len(out) > 0 {
			if err := s.ledger.MarkPublished(ctx, out, s.clock.Now()); err != nil {
				return sent, errors.Join(append(errs, fmt.Errorf("mark published: %w", err))...)
			}
			sent += len(out)
		}
		evs = rest
	}
	return sent, errors.Join(errs...)
}

// drainEvents publishes the events the deciding paths left unpublished
// (oldest first, up to Config.SweepBatch of those older than cutoff), then
// measures the outbox's lag: how long ago its oldest unpublished event
// occurred (the outbox_lag_seconds metric the template alarms on).
func (s *Service) drainEvents(ctx context.Context, cutoff time.Time, rep *SweepReport) {
	evs, err := s.ledger.Unpublished(ctx, cutoff, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list unpublished events", "error", err)
	}
	n, err := s.send(ctx, evs)
	rep.EventsResent += n
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: publish events", "error", err)
	}
	oldest, ok, err := s.ledger.OldestUnpublished(ctx)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read the event outbox's lag", "error", err)
		return
	}
	if ok {
		rep.OutboxLagSeconds = max(0, int(s.clock.Now().Sub(oldest).Seconds()))
	}
	s.metrics.Count("outbox_lag_seconds", rep.OutboxLagSeconds)
}
