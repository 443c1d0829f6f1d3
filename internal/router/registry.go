package router

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// normalized is an input value in the Confluent wire format rewritten into
// the single-object encoding (value), or the record error it got (err).
type normalized struct {
	value []byte
	err   error
	done  bool
}

// Waits between asks of a schema registry that does not answer.
const (
	registryBackoffMin = 250 * time.Millisecond
	registryBackoffMax = 10 * time.Second
)

// normalizeAll rewrites the batch's records in the Confluent wire format
// into the single-object encoding before they are decoded
// (registry.Client.Normalize). A registry that does not answer is not a
// record's fault: the batch waits for it, asking again with backoff, not
// ready meanwhile (faultrouter_registry_waiting), and nothing is
// dead-lettered for it. Nothing is produced while it waits: the batch's
// transaction has not begun. Once the registry answers, the batch carries an
// alert of scope REGISTRY that says how long routing waited.
func (r *Router) normalizeAll(ctx context.Context, b *batch) error {
	b.norm = b.norm[:0]
	if r.cfg.Registry == nil {
		return nil
	}
	b.norm = append(b.norm, make([]normalized, len(b.recs))...)
	var (
		backoff time.Duration
		since   time.Time
	)
	defer func() {
		if since.IsZero() {
			return
		}
		r.registryDown.Store(false)
		r.metrics.registryWaiting.Set(0)
		if r.Ready() {
			r.metrics.ready.Set(1)
		}
		waited := time.Since(since).Round(time.Millisecond)
		r.log.Info("schema registry answers again; routing resumes", "registry", redactURL(r.cfg.Registry.URL()), "waited", waited)
		if b.norm != nil { // not when ctx ended the wait
			r.brk.Alert(b, r.cfg.Now(), codec.AlertRegistry, event.BreakerEvent{Scope: scopeRegistry, Key: redactURL(r.cfg.Registry.URL()), Kind: event.BreakerKindAlert,
				Reason: fmt.Sprintf("the schema registry did not answer for %s from %s: routing waited for it and dead-lettered nothing for it",
					waited, since.UTC().Format(time.RFC3339))})
		}
	}()
	for i, rec := range b.recs {
		if _, ok := codec.ConfluentID(rec.Value); !ok {
			continue
		}
		for {
			v, err := r.cfg.Registry.Normalize(ctx, nil, rec.Value)
			if !errors.Is(err, registry.ErrUnavailable) {
				b.norm[i] = normalized{value: v, err: err, done: true}
				break
			}
			if since.IsZero() {
				since = time.Now()
				r.registryDown.Store(true)
				r.metrics.ready.Set(0)
				r.metrics.registryWaiting.Set(1)
				r.log.Error("schema registry unavailable; routing waits for it and dead-letters nothing for it",
					"registry", redactURL(r.cfg.Registry.URL()), "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "err", err)
			} else {
				r.log.Warn("schema registry still unavailable", "registry", redactURL(r.cfg.Registry.URL()), "waiting", time.Since(since).Round(time.Second), "err", err)
			}
			backoff = min(max(backoff*2, registryBackoffMin), registryBackoffMax)
			select {
			case <-ctx.Done():
				b.norm = nil
				return ctx.Err()
			case <-time.After(backoff):
			}
		}
	}
	return nil
}

// scopeRegistry is the scope of the alert of a schema registry outage.
const scopeRegistry = breaker.ScopeRegistry

// redactURL is u without credentials, for an alert's key.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "registry"
	}
	p.User = nil
	return p.String()
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
			r.log.Info("writing the Confluent wire format", "registry", redactURL(r.cfg.Registry.URL()))
			return nil
		}
		if !errors.Is(err, registry.ErrUnavailable) {
			return err
		}
		r.metrics.registryWaiting.Set(1)
		backoff = min(max(backoff*2, registryBackoffMin), registryBackoffMax)
		r.log.Error("schema registry unavailable; the router starts once it answers", "registry", redactURL(r.cfg.Registry.URL()), "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		r.metrics.registryWaiting.Set(0)
	}
}
