package decode

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Normalized is an input value in the Confluent wire format rewritten into
// the single-object encoding (value), or the record error it got (err).
type Normalized struct {
	value []byte
	err   error
	done  bool
}

// Waits between asks of a schema registry that does not answer.
const (
	BackoffMin = 250 * time.Millisecond
	BackoffMax = 10 * time.Second
)

// Normalizer rewrites records in the Confluent wire format into the
// single-object encoding (registry.Client.Normalize). A registry that does
// not answer is not a record's fault: the batch waits for it, asking again
// with backoff, and nothing is dead-lettered for it.
type Normalizer struct {
	// Registry is the schema registry; nil when inputs are not in the
	// Confluent wire format
	Registry *registry.Client
	Log      *slog.Logger
	// Waiting is told when a batch begins (true) and ends (false) waiting
	// for the registry
	Waiting func(waiting bool)
}

// All rewrites the records of recs in the Confluent wire format into norm
// (grown to len(recs); the others are left undone), and returns it. When it
// had to wait for the registry, waited is how long, from since.
func (z *Normalizer) All(ctx context.Context, recs []*kgo.Record, norm []Normalized) (_ []Normalized, waited time.Duration, since time.Time, err error) {
	norm = norm[:0]
	if z.Registry == nil {
		return norm, 0, time.Time{}, nil
	}
	norm = append(norm, make([]Normalized, len(recs))...)
	var backoff time.Duration
	defer func() {
		if since.IsZero() {
			return
		}
		z.Waiting(false)
		waited = time.Since(since).Round(time.Millisecond)
		z.Log.Info("schema registry answers again; routing resumes", "registry", RedactURL(z.Registry.URL()), "waited", waited)
	}()
	for i, rec := range recs {
		if _, ok := codec.ConfluentID(rec.Value); !ok {
			continue
		}
		for {
			v, err := z.Registry.Normalize(ctx, nil, rec.Value)
			if !errors.Is(err, registry.ErrUnavailable) {
				norm[i] = Normalized{value: v, err: err, done: true}
				break
			}
			if since.IsZero() {
				since = time.Now()
				z.Waiting(true)
				z.Log.Error("schema registry unavailable; routing waits for it and dead-letters nothing for it",
					"registry", RedactURL(z.Registry.URL()), "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "err", err)
			} else {
				z.Log.Warn("schema registry still unavailable", "registry", RedactURL(z.Registry.URL()), "waiting", time.Since(since).Round(time.Second), "err", err)
			}
			backoff = min(max(backoff*2, BackoffMin), BackoffMax)
			select {
			case <-ctx.Done():
				return nil, 0, since, ctx.Err()
			case <-time.After(backoff):
			}
		}
	}
	return norm, 0, since, nil
}

// RedactURL is u without credentials, for logs and an alert's key.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "registry"
	}
	p.User = nil
	return p.String()
}
