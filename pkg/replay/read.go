package replay

// read.go is the I/O of replay: it locates a time range of topics with
// offsets-for-times and reads it to its end (read_committed). The replay
// verb and the operator console both read through it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Found is a selected record and its step.
type Found struct {
	Rec  *kgo.Record
	Step Step
}

// ReadOptions say what Read selects and how it reports.
type ReadOptions struct {
	// Filter selects the steps; its Since and Until also bound the offsets
	// read.
	Filter Filter
	// ShortOf maps a full topic name to its short name (ingress, audit, ...).
	ShortOf map[string]string
	// Idle gives up on partitions that deliver nothing for this long (a
	// broker in trouble); 30 s when zero.
	Idle time.Duration
	// Progress receives the offsets and progress lines; nil discards them.
	Progress io.Writer
	// ProgressEvery and ProgressInterval: a progress line every N records
	// read, and at least this often (when positive).
	ProgressEvery    int
	ProgressInterval time.Duration
}

// partRange is the offsets [start, end) of one partition to read.
type partRange struct {
	start, end int64
}

// Read reads every partition of topics over the time range of o.Filter and
// returns the records that pass the filter, in read order.
func Read(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topics []string, o ReadOptions) ([]Found, error) {
	stderr := o.Progress
	if stderr == nil {
		stderr = io.Discard
	}
	if o.Idle <= 0 {
		o.Idle = 30 * time.Second
	}
	ranges, err := locate(ctx, opts, topics, o.Filter.Since, o.Filter.Until)
	if err != nil {
		return nil, err
	}
	consume := map[string]map[int32]kgo.Offset{}
	pending := 0
	for _, t := range sortedKeys(ranges) {
		for _, p := range sortedKeys(ranges[t]) {
			r := ranges[t][p]
			fmt.Fprintf(stderr, "replay: %s/%d: start offset %d, end offset %d (%d to read)\n", t, p, r.start, r.end, max(0, r.end-r.start))
			if r.end <= r.start {
				continue
			}
			if consume[t] == nil {
				consume[t] = map[int32]kgo.Offset{}
			}
			consume[t][p] = kgo.NewOffset().At(r.start)
			pending++
		}
	}
	var out []Found
	read := 0
	if pending > 0 {
		cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(consume), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			// a transaction ends in a control record: seeing it tells a
			// partition reached an end offset that no data record reaches
			kgo.KeepControlRecords())...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		done := map[string]map[int32]bool{}
		isDone := func(t string, p int32) bool { return done[t][p] }
		markDone := func(t string, p int32) {
			if done[t] == nil {
				done[t] = map[int32]bool{}
			}
			if !done[t][p] {
				done[t][p] = true
				pending--
			}
		}
		lastReport := time.Now()
		for pending > 0 {
			pctx, cancel := context.WithTimeout(ctx, o.Idle)
			fetches := cl.PollFetches(pctx)
			cancel()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var ferr error
			fetches.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					ferr = fmt.Errorf("replay %s/%d: %w", t, p, err)
				}
			})
			if ferr != nil {
				return nil, ferr
			}
			if fetches.NumRecords() == 0 && pctx.Err() != nil {
				// Nothing for o.Idle below the end offsets: say so, and
				// return what was read.
				for t, ps := range consume {
					for p := range ps {
						if !isDone(t, p) {
							fmt.Fprintf(stderr, "replay: %s/%d: nothing more after %s idle; stopping the partition\n", t, p, o.Idle)
							markDone(t, p)
						}
					}
				}
				break
			}
			fetches.EachRecord(func(rec *kgo.Record) {
				r := ranges[rec.Topic][rec.Partition]
				if isDone(rec.Topic, rec.Partition) || rec.Offset >= r.end {
					markDone(rec.Topic, rec.Partition)
					return
				}
				if rec.Attrs.IsControl() {
					if rec.Offset >= r.end-1 {
						markDone(rec.Topic, rec.Partition)
					}
					return
				}
				read++
				st := Decode(c, rec, o.ShortOf[rec.Topic])
				if o.Filter.Match(&st) {
					out = append(out, Found{Rec: rec, Step: st})
				}
				if rec.Offset >= r.end-1 {
					markDone(rec.Topic, rec.Partition)
				}
				if (o.ProgressEvery > 0 && read%o.ProgressEvery == 0) || (o.ProgressInterval > 0 && time.Since(lastReport) >= o.ProgressInterval) {
					fmt.Fprintf(stderr, "replay: progress: %d records read, %d matched\n", read, len(out))
					lastReport = time.Now()
				}
			})
		}
	}
	fmt.Fprintf(stderr, "replay: %d records read, %d matched\n", read, len(out))
	return out, nil
}

// locate finds each partition's offsets for the time range: the first offset
// at or after since (the log start without since) up to the first offset at
// or after until, capped by the last stable offset (read_committed).
func locate(ctx context.Context, opts []kgo.Opt, topics []string, since, until time.Time) (map[string]map[int32]partRange, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var starts kadm.ListedOffsets
	if since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, topics...)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: listing start offsets: %w", err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("replay: listing end offsets: %w", err)
	}
	var untils kadm.ListedOffsets
	if !until.IsZero() {
		if untils, err = adm.ListOffsetsAfterMilli(ctx, until.UnixMilli(), topics...); err != nil {
			return nil, fmt.Errorf("replay: listing until offsets: %w", err)
		}
	}
	if err := starts.Error(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	out := map[string]map[int32]partRange{}
	ends.Each(func(e kadm.ListedOffset) {
		r := partRange{start: 0, end: e.Offset}
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Offset >= 0 {
			r.start = s.Offset
		} else {
			r.start = e.Offset // nothing at or after since
		}
		if u, ok := untils.Lookup(e.Topic, e.Partition); ok && u.Err == nil && u.Offset >= 0 && u.Offset < r.end {
			r.end = u.Offset
		}
		if out[e.Topic] == nil {
			out[e.Topic] = map[int32]partRange{}
		}
		out[e.Topic][e.Partition] = r
	})
	for _, t := range topics {
		if out[t] == nil {
			return nil, fmt.Errorf("replay: topic %s not found", t)
		}
	}
	return out, nil
}

func sortedKeys[K string | int32, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
