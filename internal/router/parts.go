package router

import (
	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// The router is an orchestration of parts (handle.go calls them in the
// order of the data path); each is a type of its own, in the file named
// for it, or a package of its own (emit, forward, hold, restore, sweep,
// txn), and they meet at the small interfaces below. Every file belongs to one part:
//
//   - the orchestration of one batch's data path (handle.go) and these
//     parts' interfaces (parts.go);
//   - the run loop and the group session (router.go; batchsize.go, the
//     batch that follows the lag; lag.go; limits.go, the record size
//     limits; metrics.go; errors.go);
//   - input decoding (input.go; registry.go, the Confluent wire format):
//     records in, inputs out;
//   - dead letters of input whose output cannot be written (unwritable.go,
//     refusals);
//   - forwarding (package forward: Forwarder): a task's home partition,
//     and the partition counts the router routes by;
//   - the task states of the batch (state.go, batch.go), and the policy's
//     decisions on them (decide.go and retry_append.go, with pkg/policy;
//     review_sla.go, the owners' SLA clock);
//   - the output records each decision emits, built in the batch's memory
//     (package emit: Records, Arena);
//   - breaker holding (package hold: Breakers; the latch book in
//     internal/latch): breakers, held retries, latches, the breakers
//     topic and the alerts;
//   - expiry and the sweep over the time indexes (package sweep:
//     Sweeper): expiry, due retries, overdue reviews;
//   - the cost ledger (ledger.go): each decision's spend and cost
//     prevented, in the metrics and the audit record's running totals;
//   - the batch's transaction (package txn: Txn, Fence; txn.go ends it);
//   - the restore of the state store from the changelog (package
//     restore: Restorer);
//   - the partitions this instance owns (assignment.go; balancer.go, the
//     co-partitioned group balancer; membership.go, static membership and
//     its fence of a member that left with a transaction open).
//
// retry_append_fault.go is a deliberately broken build for the checker's
// self-test (build tag checkerfault), never part of a release.

// recordsOut is where a part queues the records it produces: the batch's
// output, produced in the batch's transaction (handle.go). A record is
// final once queued.
type recordsOut = hold.Out

// stateLoader reads task states from the state store (store.Store.Load):
// the state of each of ids into into, from the partition partOf names.
type stateLoader interface {
	Load(ids []string, partOf func(id string) int32, into map[string]*task.State) error
}

// assignment is what a part may ask about the partitions this instance
// owns (router.go: the assignment callbacks change them).
type assignment interface {
	// ownedSet returns the ingress partitions this instance owns.
	ownedSet() map[int32]bool
	// assignedSince returns the partitions owned once the assignment is
	// restored (ready), with the count of rebalances it is of; ok is false
	// when no rebalance happened since the count since, or while one is
	// under way.
	assignedSince(since uint64) (owned map[int32]bool, rebalances uint64, ok bool)
	// ownedPartitions returns the ingress partitions this instance owns.
	ownedPartitions() []int32
	// rebalanceCount is the count of assignment callbacks run so far.
	rebalanceCount() uint64
	// unlessRebalanced runs fn under the lock the assignment callbacks
	// hold, if it is free and no callback ran since the count since; else
	// it does nothing.
	unlessRebalanced(since uint64, fn func() error) error
}
