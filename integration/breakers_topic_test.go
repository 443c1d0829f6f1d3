package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// breakerRecord is the latest record of one key of the breakers topic, as
// a router reading it from its start sees it.
type breakerRecord struct {
	offset int64
	live   bool   // not a tombstone
	writer string // the faultrouter.breaker.instance header
	value  string
}

// breakerRecords reads e's breakers topic from its start to its last
// stable offset and returns the latest record of every key.
func (e *env) breakerRecords() map[string]breakerRecord {
	e.t.Helper()
	return readBreakerRecords(e.t, e.prefix+"faultrouter.breakers")
}

func readBreakerRecords(t *testing.T, topic string) map[string]breakerRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]breakerRecord{}
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		for _, r := range b.Records {
			out[string(r.Key)] = breakerRecord{offset: r.Offset, live: r.Value != nil, value: string(r.Value),
				writer: codec.ParseBreakerHeaders(r.Headers).Instance}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
