package router

// assignment.go is what this instance owns of the consumer group's partitions:
// the assignment callbacks restore the state of the partitions assigned
// (package restore), mark those revoked released, and keep the set of owned
// partitions the parts ask about (hold.Owner, sweep.Owner).

import (
	"context"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// onAssigned restores the state of the assigned partitions. It runs in
// franz-go's group management goroutine: on failure it reports to the run
// loop (failed) rather than leave the group here, which would deadlock.
// The router is ready once the restore of every assigned partition
// succeeded, and not ready from a revoke or loss until then, nor while a
// cooperative round that the next one adds to is all it has (balancer.go).
//
// In an eager group (balancer.go) assigned is the member's whole
// assignment, after a revoke of everything. In a cooperative group it is
// what this round added: the member keeps routing the partitions it keeps
// while the added ones are restored (their records are fetched only once
// this returns), and the batches of those it keeps commit in the new
// generation (ownedGen) from the start; only their store writes wait for
// the restore (written).
//
// Either way the owned set becomes exactly the sync's whole assignment
// (syncLog), whether or not this instance was told of every revoke:
// franz-go's transactional session passes a revoke (or loss) on only if no
// revoke or loss came since its last End, so a second rebalance while the
// run loop had not ended a transaction since the first (a restore that
// waits for an open transaction takes seconds) revokes without a word. An
// instance that kept the partitions it had lost then kept writing their
// state: stale states, committed, that their new owner restored.
func (r *Router) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32, failed chan<- error) {
	sync := r.syncs.last()
	_, gen := cl.GroupMetadata()
	kept := map[int32]bool{}
	if sync.cooperative {
		for _, p := range sync.whole[r.cfg.Topics.Ingress] {
			kept[p] = true
		}
		if len(assigned[r.cfg.Topics.Ingress]) == 0 && r.keepsAll(kept, gen) {
			// nothing added, nothing lost: routing goes on, in this generation
			r.rejoining.Store(r.revokedFirst.Swap(false)) // a revoke first: franz-go rejoins now
			r.setReady(!sync.pending)
			r.rejoinForPending(cl, sync)
			return
		}
	}
	if !r.written.LockUnless(r.storeFailed()) { // the last batch's write is done before the restore writes
		r.setReady(false)
		return // the store failed: the run loop ends the session, and Run stops
	}
	defer r.written.Unlock()
	r.rebalances.Add(1)
	r.setReady(false) // also after a revoke that was not passed on
	r.mu.Lock()
	var dropped []int32
	for p := range r.owned {
		if !kept[p] {
			dropped = append(dropped, p)
			delete(r.owned, p) // a revoke that was not passed on
		}
	}
	if len(dropped) > 0 {
		r.log.Warn("partitions revoked without notice are let go", "partitions", slices.Sorted(slices.Values(dropped)))
	}
	r.ownedGen = -1
	if len(r.owned) > 0 {
		r.ownedGen = gen // kept (cooperative): routed on in this generation
	}
	r.mu.Unlock()
	// the kept partitions' batches commit in gen while the added ones are
	// restored, unless the session began with a revoke: franz-go rejoins now
	first := r.revokedFirst.Swap(false)
	r.rejoining.Store(sync.cooperative && first)
	var parts []int32
	ingress := map[int32]bool{}
	for _, p := range assigned[r.cfg.Topics.Ingress] {
		ingress[p] = true
		if p < r.fwd.Parts().State { // an ingress partition added at runtime has no state partition: its records are forwarded
			parts = append(parts, p)
		}
	}
	// the co-partitioned assignors never split them (balancer.go); a group
	// that fell back to "range" for an older member does, while counts differ
	for _, p := range assigned[r.cfg.Topics.Decisions] {
		if p < r.fwd.Parts().State && p < r.fwd.Parts().Ingress && !ingress[p] && !kept[p] {
			r.log.Error("partition of decisions assigned without the same partition of ingress: the group uses the range assignor "+
				"(a member of an older release) while the partition counts differ; review decisions of that partition are "+
				"routed against a store this instance did not restore. Run one release in the group before adding partitions",
				"partition", p, "protocol", "range")
		}
	}
	if len(parts) > 0 || !sync.cooperative {
		// The restore, the fence of departed members and the breakers
		// topic's catch-up run at once: the partitions added wait for the
		// longest, not for all three. A dead member's open transaction
		// would hold the restore up until the broker aborts it
		// (membership.go; the restore waits for the changelog's open
		// transactions, so it reads nothing before the fence took effect);
		// and, package hold, no retry is published until the breakers
		// topic is read to where it stood now, its latches and states
		// adopted before.
		fenced, caughtUp := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(fenced)
			r.fenceDeparted(ctx, cl)
		}()
		go func() {
			defer close(caughtUp)
			r.brk.CatchUpTable(ctx, cl)
		}()
		err := r.rst.Restore(ctx, cl, parts)
		<-fenced
		<-caughtUp
		if err != nil {
			r.setReady(false)
			r.log.Error("restore failed; the session ends and the partitions are restored again", "partitions", parts, "err", err)
			select {
			case failed <- err:
			default: // one report ends the session
			}
			return
		}
	}
	r.mu.Lock()
	for _, p := range parts {
		r.owned[p] = true
	}
	r.ownedGen = gen
	r.mu.Unlock()
	if sync.pending {
		r.log.Info("partitions to come in the group's next round: ready once they are restored", "owned", r.ownedPartitions())
		r.rejoinForPending(cl, sync)
		return
	}
	r.setReady(true)
}

// rejoinForPending starts the group's next round at once when this
// member's assignment says the next one adds to it (balancer.go). The
// members that revoke what moves to it rejoin as soon as they have, but
// a member that revokes nothing learns of the round only at its next
// heartbeat; the one that gets the partitions is always such a member, so
// every partition moved waited for that heartbeat. Its join metadata
// names its generation, which the round just changed, so its rejoin
// starts a round even if it reaches the coordinator before the others'.
// ForceRebalance only signals franz-go's heartbeat loop: it is safe in an
// assignment callback, unlike a leave.
func (r *Router) rejoinForPending(cl *kgo.Client, sync syncAssignment) {
	if sync.cooperative && sync.pending {
		r.log.Info("rejoining the group at once: its next round adds partitions to this instance")
		cl.ForceRebalance()
	}
}

// keepsAll reports whether every partition this instance owns is in kept;
// if so, they are owned in generation gen from now on.
func (r *Router) keepsAll(kept map[int32]bool, gen int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.owned {
		if !kept[p] {
			return false
		}
	}
	if len(r.owned) > 0 {
		r.ownedGen = gen
	}
	return true
}

// onRevoked runs when partitions are revoked: the router is not ready until
// the next assignment is restored. franz-go's transactional session will
// not commit the transaction open now (its End aborts), and once the last
// committed batch's write is done the store holds everything this
// instance committed: it marks each revoked partition released at the
// changelog's current end (the restore trusts the local state of a partition
// it gets back only if the changelog has not moved since, but for this
// instance's own writes).
func (r *Router) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if r.syncs.last().cooperative {
		r.rejoining.Store(true) // the next assignment clears it
		if len(revoked[r.cfg.Topics.Ingress]) == 0 && len(revoked[r.cfg.Topics.Decisions]) == 0 {
			return // a cooperative session's end that revokes nothing: routing goes on
		}
		r.revokedFirst.Store(true)
	}
	r.revokedInTxn.Store(true)
	r.setReady(false)
	if !r.written.LockUnless(r.storeFailed()) { // the store holds everything committed once the last batch's write is done
		return // the store failed: no release mark (a restart restores the partitions)
	}
	defer r.written.Unlock()
	r.rebalances.Add(1)
	var held []int32 // only partitions whose state was restored: a failed restore leaves no mark
	r.mu.Lock()
	for _, p := range revoked[r.cfg.Topics.Ingress] {
		if r.owned[p] {
			held = append(held, p)
		}
		delete(r.owned, p)
	}
	r.ownedGen = -1
	r.mu.Unlock()
	r.log.Info("partitions revoked", "partitions", slices.Sorted(slices.Values(revoked[r.cfg.Topics.Ingress])))
	r.rst.MarkReleased(ctx, cl, held)
}

// onLost runs when partitions are lost (the session expired or the group
// errored): not ready, and no release mark, since another instance may
// already be writing to them.
func (r *Router) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	r.setReady(false)
	r.rebalances.Add(1)
	r.mu.Lock()
	for _, p := range lost[r.cfg.Topics.Ingress] {
		delete(r.owned, p)
	}
	r.ownedGen = -1
	r.mu.Unlock()
}

func (r *Router) setReady(ready bool) {
	r.ready.Store(ready)
	r.readyGauge()
}

// readyGauge sets faultrouter_ready from Ready.
func (r *Router) readyGauge() {
	if r.Ready() {
		r.metrics.ready.Set(1)
	} else {
		r.metrics.ready.Set(0)
	}
}

// ownedPartitions returns the ingress partitions this instance owns, in
// order.
func (r *Router) ownedPartitions() []int32 {
	ps, _ := r.ownedWithGeneration()
	return ps
}

// ownedWithGeneration returns the ingress partitions this instance owns and
// the group generation they were assigned in (-1: none).
func (r *Router) ownedWithGeneration() ([]int32, int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.owned)), r.ownedGen
}

// ownedSet returns the ingress partitions this instance owns, as a set.
func (r *Router) ownedSet() map[int32]bool {
	owned := map[int32]bool{}
	for _, p := range r.ownedPartitions() {
		owned[p] = true
	}
	return owned
}

// assignedSince returns the partitions this instance owns once a rebalance
// after the count since is restored. The callbacks count a rebalance
// (rebalances) before they change the owned set and clear the ready flag
// before that, so a rebalance that changed them while they were read shows
// in the count, and ok is false then.
func (r *Router) assignedSince(since uint64) (owned map[int32]bool, rebalances uint64, ok bool) {
	rb := r.rebalances.Load()
	if rb == since || !r.Ready() {
		return nil, 0, false
	}
	owned = r.ownedSet()
	if r.rebalances.Load() != rb {
		return nil, 0, false
	}
	return owned, rb, true
}

// rebalanceCount is the count of assignment callbacks run so far.
func (r *Router) rebalanceCount() uint64 { return r.rebalances.Load() }

// unlessRebalanced runs fn under the lock the assignment callbacks hold
// (written), if it is free and no callback ran since the count since: a
// callback may be waiting for the batch's transaction to end, and one that
// ran may have restored what fn would change.
func (r *Router) unlessRebalanced(since uint64, fn func() error) error {
	if !r.written.TryLock() {
		return nil
	}
	defer r.written.Unlock()
	if r.rebalances.Load() != since {
		return nil
	}
	return fn()
}

// owner is the assignment as the breakers and the sweep ask about it
// (hold.Owner, sweep.Owner).
type owner struct{ r *Router }

func (o owner) OwnedPartitions() []int32 { return o.r.ownedPartitions() }

func (o owner) RebalanceCount() uint64 { return o.r.rebalanceCount() }

func (o owner) UnlessRebalanced(since uint64, fn func() error) error {
	return o.r.unlessRebalanced(since, fn)
}

func (o owner) OwnedSet() map[int32]bool { return o.r.ownedSet() }

func (o owner) AssignedSince(since uint64) (map[int32]bool, uint64, bool) {
	return o.r.assignedSince(since)
}
