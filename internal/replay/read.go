package replay

// read.go is the I/O of replay: it locates a time range of topics with
// offsets-for-times and reads it to its end with internal/scan (read_committed). The replay
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

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
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
	ShortOf map[string]topicspec.Short
	// Key, when set, reads of each topic only the partition the default
	// partitioner (murmur2, as the Java client) puts records of this key in:
	// one task's records when every topic is keyed by task ID.
	Key []byte
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
	if o.Key != nil {
		ranges = keyPartitions(ranges, o.Key)
	}
	for _, t := range sortedKeys(ranges) {
		for _, p := range sortedKeys(ranges[t]) {
			r := ranges[t][p]
			fmt.Fprintf(stderr, "replay: %s/%d: start offset %d, end offset %d (%d to read)\n", t, p, r.Start, r.End, max(0, r.End-r.Start))
		}
	}
	var out []Found
	read := 0
	lastReport := time.Now()
	err = scan.Read(ctx, opts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			read++
			st := Decode(c, rec, o.ShortOf[rec.Topic])
			if o.Filter.Match(&st) {
				out = append(out, Found{Rec: rec, Step: st})
			}
			if (o.ProgressEvery > 0 && read%o.ProgressEvery == 0) || (o.ProgressInterval > 0 && time.Since(lastReport) >= o.ProgressInterval) {
				fmt.Fprintf(stderr, "replay: progress: %d records read, %d matched, %d offsets left in %d partitions\n", read, len(out), b.Left, b.Partitions)
				lastReport = time.Now()
			}
		}
		return nil
	}, scan.Idle(o.Idle))
	if errors.Is(err, scan.ErrStalled) {
		// a broker in trouble: say so, and return what was read
		fmt.Fprintf(stderr, "replay: %v; stopping there\n", err)
	} else if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	fmt.Fprintf(stderr, "replay: %d records read, %d matched\n", read, len(out))
	return out, nil
}

// locate finds each partition's offsets for the time range: the first offset
// at or after since (the log start without since) up to the first offset at
// or after until, capped by the last stable offset (read_committed).
func locate(ctx context.Context, opts []kgo.Opt, topics []string, since, until time.Time) (scan.Ranges, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	out, err := scan.Committed(ctx, adm, topics...)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if !since.IsZero() {
		starts, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
		if err == nil {
			err = starts.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("replay: listing start offsets: %w", err)
		}
		for t, ps := range out {
			for p, r := range ps {
				if s, ok := starts.Lookup(t, p); ok && s.Offset >= 0 {
					r.Start = max(r.Start, s.Offset)
				} else {
					r.Start = r.End // nothing at or after since
				}
				ps[p] = r
			}
		}
	}
	if !until.IsZero() {
		untils, err := adm.ListOffsetsAfterMilli(ctx, until.UnixMilli(), topics...)
		if err != nil {
			return nil, fmt.Errorf("replay: listing until offsets: %w", err)
		}
		for t, ps := range out {
			for p, r := range ps {
				if u, ok := untils.Lookup(t, p); ok && u.Err == nil && u.Offset >= 0 && u.Offset < r.End {
					r.End = u.Offset
				}
				ps[p] = r
			}
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

// keyPartitions keeps of each topic the partition the default partitioner
// puts key in.
func keyPartitions(ranges scan.Ranges, key []byte) scan.Ranges {
	out := scan.Ranges{}
	for t, ps := range ranges {
		n := len(ps)
		if n == 0 {
			continue
		}
		p := int32(kgo.StickyKeyPartitioner(nil).ForTopic(t).Partition(&kgo.Record{Key: key}, n))
		if r, ok := ps[p]; ok {
			out[t] = map[int32]scan.Range{p: r}
		}
	}
	return out
}
