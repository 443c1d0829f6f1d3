package router

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// lag is the consumer lag of the partitions this instance owns, per input
// topic: for each partition, the last stable offset (read_committed) minus
// the first offset of the latest poll that returned records for it (its
// records are not routed until their transaction commits). It is approximate: a partition is only measured when it has
// records, and a transaction's commit marker counts one offset.
type lag struct {
	mu   sync.Mutex
	last map[string]map[int32]int64 // topic -> partition -> lag
}

// observeLag updates the consumer lag gauge from one poll.
func (r *Router) observeLag(fetches kgo.Fetches) {
	r.metrics.lag.mu.Lock()
	defer r.metrics.lag.mu.Unlock()
	if r.metrics.lag.last == nil {
		r.metrics.lag.last = map[string]map[int32]int64{}
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		end := p.LastStableOffset
		if end < 0 {
			end = p.HighWatermark
		}
		// the batch's records count until its transaction commits: a batch
		// polled again and again (a produce failing) shows as lag
		next := p.Records[0].Offset
		if r.metrics.lag.last[p.Topic] == nil {
			r.metrics.lag.last[p.Topic] = map[int32]int64{}
		}
		r.metrics.lag.last[p.Topic][p.Partition] = max(end-next, 0)
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
