package router

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// lag is the consumer lag of the partitions this instance owns, per input
// topic: for each partition, the last stable offset (read_committed) minus
// the offset up to which the router has committed. A polled batch counts
// until its transaction commits (observeLag at the poll, observeCommitted
// after the commit), so a batch polled again and again (a produce failing)
// shows as lag. It is approximate: a partition is only measured when it has
// records, and a transaction's commit marker counts one offset.
type lag struct {
	mu   sync.Mutex
	last map[string]map[int32]int64 // topic -> partition -> lag
}

// observeLag updates the consumer lag gauge from one poll: the polled
// records are not routed yet.
func (r *Router) observeLag(fetches kgo.Fetches) { r.setLag(fetches, false) }

// observeCommitted updates the consumer lag gauge once the poll's
// transaction committed: its records are routed.
func (r *Router) observeCommitted(fetches kgo.Fetches) { r.setLag(fetches, true) }

func (r *Router) setLag(fetches kgo.Fetches, committed bool) {
	r.metrics.lag.mu.Lock()
	defer r.metrics.lag.mu.Unlock()
	if r.metrics.lag.last == nil {
		r.metrics.lag.last = map[string]map[int32]int64{}
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		next := p.Records[0].Offset
		if committed {
			next = p.Records[len(p.Records)-1].Offset + 1
		}
		if r.metrics.lag.last[p.Topic] == nil {
			r.metrics.lag.last[p.Topic] = map[int32]int64{}
		}
		r.metrics.lag.last[p.Topic][p.Partition] = behind(p, next)
	})
	owned := map[int32]bool{}
	for _, p := range r.ownedPartitions() {
		owned[p] = true
	}
	for _, topic := range []string{r.cfg.Topics.Ingress, r.cfg.Topics.Decisions} {
		var sum int64
		for p, l := range r.metrics.lag.last[topic] {
			if owned[p] {
				sum += l
			}
		}
		r.metrics.consumerLag.WithLabelValues(topic).Set(float64(sum))
	}
}

// behind is how many records of partition p, up to its last stable offset
// (its high watermark when the fetch has none), come at or after offset
// next.
func behind(p kgo.FetchTopicPartition, next int64) int64 {
	end := p.LastStableOffset
	if end < 0 {
		end = p.HighWatermark
	}
	return max(end-next, 0)
}
