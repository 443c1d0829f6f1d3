package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
)

// Range is a time range of records: Since <= timestamp < Until; a zero bound
// is open.
type Range struct{ Since, Until time.Time }

// Contains reports whether t lies in the range.
func (r Range) Contains(t time.Time) bool {
	return (r.Since.IsZero() || !t.Before(r.Since)) && (r.Until.IsZero() || t.Before(r.Until))
}

// Each reads every partition of topics over the time range (located with
// offsets-for-times as Read does, up to the committed end) and calls fn with
// each record whose timestamp lies in it, without keeping them: for sums over
// long ranges. A partition that delivers nothing for idle (a broker in
// trouble) is an error naming it; progress lines go to progress (nil
// discards them).
func Each(ctx context.Context, opts []kgo.Opt, topics []string, r Range, idle time.Duration, progress io.Writer,
	fn func(*kgo.Record) error) error {
	if progress == nil {
		progress = io.Discard
	}
	if idle <= 0 {
		idle = 30 * time.Second
	}
	ranges, err := locate(ctx, opts, topics, r.Since, r.Until)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "reading %d offsets of %v\n", ranges.Len(), topics)
	err = scan.Read(ctx, opts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			if !r.Contains(rec.Timestamp) {
				continue
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		return nil
	}, scan.Idle(idle))
	if errors.Is(err, scan.ErrStalled) {
		return fmt.Errorf("replay: %w", err)
	}
	return err
}
