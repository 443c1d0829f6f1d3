package router

// fence.go fences every transaction by the consumer group.

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fence returns the function that completes a transaction's offset commit
// with the committed offset of every partition this instance owns that the
// transaction did not consume. The broker checks the group generation and
// member of an offset commit, so every transaction is fenced by the group,
// including one that consumed nothing and only publishes due retries, alerts
// or tombstones: an instance that was paused past its session timeout (its
// partitions now another's) has such a transaction aborted instead of
// publishing, a second time, a retry its successor published. franz-go skips
// the offset commit of a transaction that consumed nothing; it calls this
// function before that check, under its transaction lock, so it only
// mutates the request. A partition with no committed offset yet is left out.
func (r *Router) fence(cl *kgo.Client) func(*kmsg.TxnOffsetCommitRequest) error {
	owned := r.ownedPartitions()
	committed := cl.CommittedOffsets()
	return func(req *kmsg.TxnOffsetCommitRequest) error {
		for _, topic := range []string{r.cfg.Topics.Ingress, r.cfg.Topics.Decisions} {
			ti := slices.IndexFunc(req.Topics, func(t kmsg.TxnOffsetCommitRequestTopic) bool { return t.Topic == topic })
			for _, p := range owned {
				eo, ok := committed[topic][p]
				if !ok || eo.Offset < 0 {
					continue
				}
				if ti < 0 {
					t := kmsg.NewTxnOffsetCommitRequestTopic()
					t.Topic = topic
					req.Topics = append(req.Topics, t)
					ti = len(req.Topics) - 1
				}
				rt := &req.Topics[ti]
				if slices.ContainsFunc(rt.Partitions, func(x kmsg.TxnOffsetCommitRequestTopicPartition) bool { return x.Partition == p }) {
					continue // consumed in this transaction: its new offset is there
				}
				rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
				rp.Metadata = &req.MemberID
				rt.Partitions = append(rt.Partitions, rp)
			}
		}
		return nil
	}
}
