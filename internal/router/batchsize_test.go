package router

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBatchSizer guards the rule that makes a batch follow the lag: under a
// backlog a batch that filled its limit doubles the next one's, up to the
// memory bound (records and bytes) and as far as the latency bound allows at
// the last batch's rate; a batch that left nothing behind goes back to the
// light-load limit; one over the latency bound shrinks to what fits in it.
func TestBatchSizer(t *testing.T) {
	s := batchSizer{
		base:    batchLimit{records: 5000, bytes: 16 << 20},
		max:     batchLimit{records: 50_000, bytes: 32 << 20},
		latency: 500 * time.Millisecond,
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name string
		cur  batchLimit
		seen batchSeen
		want batchLimit
	}{
		{"caught up stays at the light-load limit", s.base,
			batchSeen{records: 300, bytes: 90_000, lag: 0, took: ms(15)}, s.base},
		{"caught up after a backlog goes back to the light-load limit", batchLimit{40_000, 32 << 20},
			batchSeen{records: 12_000, bytes: 3 << 20, lag: 0, took: ms(120)}, s.base},
		{"a full batch with a backlog behind it doubles", s.base,
			batchSeen{records: 5000, bytes: 1 << 20, lag: 295_000, took: ms(60)}, batchLimit{10_000, 32 << 20}},
		{"doubling stops at the record bound", batchLimit{40_000, 32 << 20},
			batchSeen{records: 40_000, bytes: 10 << 20, lag: 100_000, took: ms(200)}, batchLimit{50_000, 32 << 20}},
		{"a batch full by its bytes grows too, records within the bound", batchLimit{10_000, 16 << 20},
			batchSeen{records: 9000, bytes: 17 << 20, lag: 100_000, took: ms(100)}, batchLimit{20_000, 32 << 20}},
		{"growth stops where the last batch's rate meets the latency bound", batchLimit{20_000, 32 << 20},
			batchSeen{records: 20_000, bytes: 6 << 20, lag: 100_000, took: ms(400)}, batchLimit{25_000, 32 << 20}},
		{"a full batch at the latency bound keeps its limit", batchLimit{20_000, 32 << 20},
			batchSeen{records: 20_000, bytes: 6 << 20, lag: 100_000, took: ms(500)}, batchLimit{20_000, 32 << 20}},
		{"a batch over the latency bound shrinks to what fits", batchLimit{40_000, 32 << 20},
			batchSeen{records: 40_000, bytes: 10 << 20, lag: 100_000, took: ms(1000)}, batchLimit{20_000, 16 << 20}},
		{"shrinking stops at the light-load limit", batchLimit{8000, 16 << 20},
			batchSeen{records: 8000, bytes: 2 << 20, lag: 100_000, took: ms(2000)}, s.base},
		{"a batch the fetches kept under its limit keeps the limit", batchLimit{20_000, 32 << 20},
			batchSeen{records: 7000, bytes: 2 << 20, lag: 50_000, took: ms(80)}, batchLimit{20_000, 32 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.next(tc.cur, tc.seen); got != tc.want {
				t.Errorf("next(%+v, %+v) = %+v, want %+v", tc.cur, tc.seen, got, tc.want)
			}
		})
	}
}

// TestBatchSizerDrain guards that a backlog drain reaches the largest batch
// in a few batches and that the first batch after it is caught up is a
// light-load batch again: the sequence of limits over a drain whose batches
// take 10 ms per 1000 records.
func TestBatchSizerDrain(t *testing.T) {
	s := batchSizer{
		base:    batchLimit{records: 5000, bytes: 16 << 20},
		max:     batchLimit{records: 50_000, bytes: 32 << 20},
		latency: 500 * time.Millisecond,
	}
	lag := int64(300_000)
	l := s.base
	var limits []int
	for lag > 0 {
		n := int(min(int64(l.records), lag))
		lag -= int64(n)
		l = s.next(l, batchSeen{records: n, bytes: 300 * n, lag: lag, took: time.Duration(n) * 10 * time.Microsecond})
		limits = append(limits, l.records)
	}
	want := []int{10_000, 20_000, 40_000, 50_000, 50_000, 50_000, 50_000, 50_000, 5000}
	if len(limits) != len(want) {
		t.Fatalf("limits over the drain = %v, want %v", limits, want)
	}
	for i := range want {
		if limits[i] != want[i] {
			t.Fatalf("limits over the drain = %v, want %v", limits, want)
		}
	}
	if s.grown(s.base) || !s.grown(batchLimit{10_000, 16 << 20}) {
		t.Error("grown: only a limit above the light-load one is grown")
	}
}

// TestBatchLimitsValidate guards that a batch bound below the light-load
// poll bound is refused with the field's name.
func TestBatchLimitsValidate(t *testing.T) {
	base := Default()
	base.ClientOpts = []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}
	base.Topics = Topics{Ingress: "i", Decisions: "d", Retry: "r", Review: "v", Audit: "a", DeadLetter: "l", Alerts: "x", State: "s"}
	base.StateDir = "dir"
	for _, tc := range []struct {
		field  string
		adjust func(*Config)
	}{
		{"MaxBatchRecords", func(c *Config) { c.MaxBatchRecords = c.MaxPollRecords - 1 }},
		{"MaxBatchBytes", func(c *Config) { c.MaxBatchBytes = c.MaxPollBytes - 1 }},
		{"MaxBatchLatency", func(c *Config) { c.MaxBatchLatency = 0 }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			c := base
			tc.adjust(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tc.field)
			}
		})
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
}
