// Package scan reads Kafka partitions over a fixed range of offsets and
// stops: by default from their log start to their committed end (the last
// stable offset) at the moment the scan is planned. It is the one bounded
// reader of faultrouter: `tail --until-end`, `replay`, the router's state
// restore and the integration tests' verifier all read through it.
//
// The reader consumes with read_committed, so records of aborted
// transactions are never seen, and keeps the transaction markers (control
// records): a transaction ends in a marker, so the offset just below a
// last stable offset is often a marker that no data record reaches. A
// partition is done when the reader sees any record, data or marker, at or
// past the offset before its end. It never waits for a quiet spell.
package scan

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Range is the offsets [Start, End) of one partition to read.
type Range struct{ Start, End int64 }

// Ranges are the ranges to read, by topic and partition. A partition whose
// range is empty (End <= Start) is not read.
type Ranges map[string]map[int32]Range

// Set sets the range of one partition.
func (rs Ranges) Set(topic string, partition int32, r Range) {
	if rs[topic] == nil {
		rs[topic] = map[int32]Range{}
	}
	rs[topic][partition] = r
}

// Len returns the number of offsets the ranges span, markers included.
func (rs Ranges) Len() int64 {
	var n int64
	for _, ps := range rs {
		for _, r := range ps {
			n += max(0, r.End-r.Start)
		}
	}
	return n
}

// Committed returns, for every partition of topics, the range from its log
// start offset to its last stable offset now: everything committed when it
// is called. It fails when a topic does not exist.
func Committed(ctx context.Context, adm *kadm.Client, topics ...string) (Ranges, error) {
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("scan: listing start offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("scan: listing stable offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	rs := Ranges{}
	ends.Each(func(e kadm.ListedOffset) {
		r := Range{Start: e.Offset, End: e.Offset}
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Offset >= 0 {
			r.Start = s.Offset
		}
		rs.Set(e.Topic, e.Partition, r)
	})
	for _, t := range topics {
		if len(rs[t]) == 0 {
			return nil, fmt.Errorf("scan: topic %s has no partitions (does it exist?)", t)
		}
	}
	return rs, nil
}

// Batch is what one fetch delivered within the ranges.
type Batch struct {
	// Records are the data records, in offset order within each partition;
	// never a marker, never a record at or past its partition's end.
	Records []*kgo.Record
	// Markers are the transaction markers (control records) read.
	Markers []*kgo.Record
	// Next is, for each partition this batch read, the offset after the
	// last record or marker read: where a later read resumes.
	Next map[string]map[int32]int64
	// Left is the number of offsets still to read in the partitions not
	// done, and Partitions how many those are, after this batch.
	Left       int64
	Partitions int
}

// Stop, returned by the function given to Read, ends the read early without
// an error.
var Stop = errors.New("scan: stop")

// ErrStalled is returned (wrapped, naming the partitions) when nothing was
// delivered for the Idle duration while partitions were short of their end.
var ErrStalled = errors.New("scan: nothing delivered")

// Opt is an optional knob of Read.
type Opt func(*config)

type config struct {
	idle        time.Duration
	uncommitted bool
}

// Idle gives up once no fetch delivered anything for d while partitions
// are short of their end (a broker in trouble), returning ErrStalled.
// Default 0: wait as long as the context allows.
func Idle(d time.Duration) Opt { return func(c *config) { c.idle = d } }

// Uncommitted reads with read_uncommitted: records of aborted and open
// transactions are delivered too. Give it ranges that end at the high
// watermarks (kadm ListEndOffsets). For checks that count what aborted;
// default read_committed.
func Uncommitted() Opt { return func(c *config) { c.uncommitted = true } }

// Read reads ranges with a client built from clientOpts (seeds, SASL, TLS;
// no consume options) and calls each with every fetch's batch until every
// partition reached its end. It returns nil at the end or when each
// returns Stop, the error each returns, ctx.Err() (wrapped, naming the
// partitions short of their end) when ctx ends, a fetch
// error naming its partition, or ErrStalled (see Idle).
func Read(ctx context.Context, clientOpts []kgo.Opt, ranges Ranges, each func(*Batch) error, opts ...Opt) error {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	consume := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]int64{} // partitions not done: the next offset to read
	for t, ps := range ranges {
		for p, r := range ps {
			if r.End <= r.Start {
				continue
			}
			if consume[t] == nil {
				consume[t], left[t] = map[int32]kgo.Offset{}, map[int32]int64{}
			}
			consume[t][p] = kgo.NewOffset().At(r.Start)
			left[t][p] = r.Start
		}
	}
	if len(consume) == 0 {
		return nil
	}
	iso := kgo.ReadCommitted()
	if cfg.uncommitted {
		iso = kgo.ReadUncommitted()
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, clientOpts...),
		kgo.ConsumePartitions(consume),
		kgo.FetchIsolationLevel(iso),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return fmt.Errorf("scan: client: %w", err)
	}
	defer cl.Close()

	for len(left) > 0 {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.idle > 0 {
			pctx, cancel = context.WithTimeout(ctx, cfg.idle)
		}
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w, short of the end of %s", err, partitions(left))
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("scan: reading %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		b := &Batch{Next: map[string]map[int32]int64{}}
		fetches.EachRecord(func(rec *kgo.Record) {
			next, ok := left[rec.Topic][rec.Partition]
			if !ok || rec.Offset < next {
				return // done already, or a record before the range
			}
			end := ranges[rec.Topic][rec.Partition].End
			if rec.Offset >= end {
				// committed after the scan was planned: everything
				// below the end was delivered before it
				next = end
			} else {
				next = rec.Offset + 1
				if rec.Attrs.IsControl() {
					b.Markers = append(b.Markers, rec)
				} else {
					b.Records = append(b.Records, rec)
				}
			}
			if b.Next[rec.Topic] == nil {
				b.Next[rec.Topic] = map[int32]int64{}
			}
			b.Next[rec.Topic][rec.Partition] = next
			if next >= end {
				delete(left[rec.Topic], rec.Partition)
				if len(left[rec.Topic]) == 0 {
					delete(left, rec.Topic)
				}
			} else {
				left[rec.Topic][rec.Partition] = next
			}
		})
		if len(b.Next) == 0 {
			if cfg.idle > 0 && pctx.Err() != nil {
				return fmt.Errorf("%w for %s below the end offsets of %s", ErrStalled, cfg.idle, partitions(left))
			}
			continue
		}
		for t, ps := range left {
			for p, next := range ps {
				b.Left += ranges[t][p].End - next
				b.Partitions++
			}
		}
		if err := each(b); err != nil {
			if errors.Is(err, Stop) {
				return nil
			}
			return err
		}
	}
	return nil
}

// partitions names the partitions of m as topic/partition, sorted.
func partitions(m map[string]map[int32]int64) string {
	var names []string
	for t, ps := range m {
		for p := range ps {
			names = append(names, fmt.Sprintf("%s/%d", t, p))
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
