package txn

// fence.go fences every transaction by the consumer group.

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Fence returns the function that completes a transaction's offset commit
// with the committed offset of every partition this instance owns (of the
// input topics, in the generation the commit is made in: owner) that the
// transaction did not consume (cl's committed offsets). The broker checks the group generation and
// member of an offset commit, so every transaction is fenced by the group,
// including one that consumed nothing and only publishes due retries, alerts
// or tombstones: an instance that was paused past its session timeout (its
// partitions now another's) has such a transaction aborted instead of
// publishing, a second time, a retry its successor published. franz-go skips
// the offset commit of a transaction that consumed nothing; it calls this
// function before that check, under its transaction lock, so it only
// mutates the request. A partition with no committed offset yet is left out.
//
// The broker checks that the member is of the group's current generation,
// not that it owns what it wrote: an instance whose owned set is of an
// earlier generation than the one it commits in (a rebalance it was not
// told of has completed) would commit state of partitions that are now
// another's. Such a transaction is aborted (ILLEGAL_GENERATION, which
// franz-go aborts on), and the batch consumed again once the assignment of
// the new generation is restored. An instance that owns nothing writes no
// partition's state: its transactions (breaker changes it adopted, on the
// alerts topic) are not held to a generation.
//
// owner returns the partitions this instance owns and the generation they
// were assigned in, once that is gen or known not to become gen. A
// cooperative member's transaction that ends while the member rejoins
// commits once the join is done, in the new generation (franz-go holds
// commits during a join), a moment before the assignment callback has told
// the router what it keeps: owner waits for that, so that the batch of the
// partitions it keeps commits rather than aborts (one that lost a
// partition is aborted by franz-go's session).
func Fence(owner func(gen int32) ([]int32, int32), topics []string, cl *kgo.Client) func(*kmsg.TxnOffsetCommitRequest) error {
	committed := cl.CommittedOffsets()
	return func(req *kmsg.TxnOffsetCommitRequest) error {
		owned, gen := owner(req.Generation)
		if len(owned) > 0 && req.Generation != gen {
			return fmt.Errorf("router: the transaction commits in group generation %d, the partitions this instance owns are of generation %d: %w",
				req.Generation, gen, kerr.IllegalGeneration)
		}
		for _, topic := range topics {
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
