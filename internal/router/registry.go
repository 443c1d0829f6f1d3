package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// scopeRegistry is the scope of the alert of a schema registry outage.
const scopeRegistry = breaker.ScopeRegistry

// registryAlert is the alert a batch carries once the schema registry at
// url answers again after routing waited for it from since.
func registryAlert(url string, waited time.Duration, since time.Time) event.BreakerEvent {
	return event.BreakerEvent{Scope: scopeRegistry, Key: decode.RedactURL(url), Kind: event.BreakerKindAlert,
		Reason: fmt.Sprintf("the schema registry did not answer for %s from %s: routing waited for it and dead-lettered nothing for it",
			waited, since.UTC().Format(time.RFC3339))}
}

// registryWaiting says whether a batch waits for the schema registry: not
// ready meanwhile (Ready), with faultrouter_registry_waiting 1.
func (r *Router) registryWaiting(waiting bool) {
	r.registryDown.Store(waiting)
	if waiting {
		r.metrics.registryWaiting.Set(1)
		r.metrics.ready.Set(0)
		return
	}
	r.metrics.registryWaiting.Set(0)
	if r.Ready() {
		r.metrics.ready.Set(1)
	}
}

// prepareFramer registers (or, with LookupSchemasOnly, looks up) the
// schemas of the router's outputs under their subjects, for the Confluent
// wire format, waiting with backoff while the registry does not answer. A
// schema the registry refuses is an error: the router does not start.
func (r *Router) prepareFramer(ctx context.Context) error {
	if r.cfg.WireFormat != registry.Confluent || r.framer != nil {
		return nil
	}
	t := r.cfg.Topics
	topics, err := registry.Schemas{Retry: t.Retry, Review: t.Review, Audit: t.Audit, DeadLetter: t.DeadLetter, Alerts: t.Alerts}.TopicSchemas()
	if err != nil {
		return err
	}
	backoff := time.Duration(0)
	for {
		f, err := r.cfg.Registry.Framer(ctx, topics, !r.cfg.LookupSchemasOnly)
		if err == nil {
			r.framer = f
			r.out.SetFramer(f)
			r.brk.SetFramer(f)
			r.log.Info("writing the Confluent wire format", "registry", decode.RedactURL(r.cfg.Registry.URL()))
			return nil
		}
		if !errors.Is(err, registry.ErrUnavailable) {
			return err
		}
		r.metrics.registryWaiting.Set(1)
		backoff = min(max(backoff*2, decode.BackoffMin), decode.BackoffMax)
		r.log.Error("schema registry unavailable; the router starts once it answers", "registry", decode.RedactURL(r.cfg.Registry.URL()), "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		r.metrics.registryWaiting.Set(0)
	}
}
