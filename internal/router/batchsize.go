package router

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A batch follows the lag. At light load a batch is what one poll and its
// top-up return, up to MaxPollRecords: the commit interval stays short. Under
// a backlog (after an outage, after a deploy) a transaction's fixed cost (its
// flush, offset commit and end markers) is spread over more records: each
// batch that filled its limit and left records behind it doubles the limit
// of the next, up to MaxBatchRecords and MaxBatchBytes (the memory a batch
// holds) and as far as MaxBatchLatency allows at the rate the last batch was
// routed. A batch that left nothing behind sets the limit back to
// MaxPollRecords; one that took longer than MaxBatchLatency shrinks it to
// what fits.

// batchLimit bounds one batch: its records and the bytes of their keys and
// values.
type batchLimit struct {
	records, bytes int
}

// batchSeen is what one batch saw: its size, the records left behind it on
// the partitions it polled (lag) and the time from its poll to its commit.
type batchSeen struct {
	records, bytes int
	lag            int64
	took           time.Duration
}

// batchSizer sizes the next batch from the last one. It is a pure function
// of its bounds and what the batch saw: no clock, no I/O.
type batchSizer struct {
	base, max batchLimit
	latency   time.Duration
}

// next returns the limit of the batch after one that ran under cur and saw
// seen.
func (s batchSizer) next(cur batchLimit, seen batchSeen) batchLimit {
	if seen.lag <= 0 {
		return s.base // caught up: short batches, short tail
	}
	full := seen.records >= cur.records || seen.bytes >= cur.bytes
	switch {
	case seen.took > s.latency && seen.records > 0:
		// over the latency bound: the records that fit in it at this rate
		f := float64(s.latency) / float64(seen.took)
		return s.clamp(batchLimit{records: int(float64(seen.records) * f), bytes: int(float64(max(seen.bytes, 1)) * f)})
	case !full:
		// the poll had fewer records than the limit (the fetches are the
		// bound): keep the limit
		return cur
	}
	f := 2.0
	if seen.took > 0 {
		f = min(f, float64(s.latency)/float64(seen.took))
	}
	if f <= 1 {
		return cur
	}
	return s.clamp(batchLimit{records: int(float64(cur.records) * f), bytes: int(float64(cur.bytes) * f)})
}

// clamp keeps l within the sizer's bounds. A bytes limit is never set below
// the base's, nor records below the base's: at worst a batch is a light-load
// batch.
func (s batchSizer) clamp(l batchLimit) batchLimit {
	l.records = min(max(l.records, s.base.records), s.max.records)
	l.bytes = min(max(l.bytes, s.base.bytes), s.max.bytes)
	return l
}

// grown reports whether l is above the light-load limit: the batch then
// polls until it reaches l or a poll returns nothing.
func (s batchSizer) grown(l batchLimit) bool {
	return l.records > s.base.records || l.bytes > s.base.bytes
}

// newBatchSizer returns the sizer of a router's config.
func newBatchSizer(c *Config) batchSizer {
	return batchSizer{
		base:    batchLimit{records: c.MaxPollRecords, bytes: c.MaxPollBytes},
		max:     batchLimit{records: c.MaxBatchRecords, bytes: c.MaxBatchBytes},
		latency: c.MaxBatchLatency,
	}
}

// fetchSize returns the records of fetches and the bytes of their keys and
// values.
func fetchSize(fetches kgo.Fetches) (records, bytes int) {
	fetches.EachRecord(func(rec *kgo.Record) {
		records++
		bytes += len(rec.Key) + len(rec.Value)
	})
	return records, bytes
}

// fetchLag returns the records left behind fetches on the partitions they
// polled: each partition's last stable offset minus the offset after its
// last record polled (fetches may hold several polls: a partition's last
// one counts).
func fetchLag(fetches kgo.Fetches) int64 {
	type tp struct {
		topic     string
		partition int32
	}
	left := map[tp]int64{}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		left[tp{p.Topic, p.Partition}] = behind(p, p.Records[len(p.Records)-1].Offset+1)
	})
	var lag int64
	for _, l := range left {
		lag += l
	}
	return lag
}
