package router

// txn.go ends a batch's transaction (package txn produces it): it commits
// unless a record failed, fenced by the group (txn.Fence), and counts and
// logs what happened.

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/txn"
)

// end flushes the batch's records and ends its transaction: it commits
// unless a record failed, fenced by the group (txn.Fence). It reports
// whether the transaction committed; a batch whose transaction did not is
// consumed again.
func (r *Router) end(ctx context.Context, t *txn.Txn, b *batch, fetches kgo.Fetches) (committed bool, err error) {
	try := kgo.TryCommit
	if err := t.Flush(ctx); err != nil {
		return false, err
	}
	failed, perr := t.Refused()
	if perr != nil {
		r.log.Warn("produce failed; aborting the transaction", "err", perr)
		try = kgo.TryAbort
		r.unw.Remember(failed, b.origins()) // package refuse: dead-lettered when polled again
	}
	b.rebalances = r.rebalances.Load() // before the commit: a rebalance after it may replace its states
	owned := r.ownedPartitions()
	var ok bool
	if len(owned) == 0 && b.began == b.rebalances && fetches.NumRecords() == 0 {
		// it consumed nothing, and this instance owned no partition while
		// it ran: it writes no partition's state or retries, and needs no
		// group session (txn.EndAlone)
		ok, err = t.EndAlone(ctx, try)
	} else {
		r.awaitJoined(ctx)
		fence := txn.Fence(r.ownedIn, []string{r.cfg.Topics.Ingress, r.cfg.Topics.Decisions}, t.Client())
		ok, err = t.End(ctx, fence, try)
	}
	r.revokedInTxn.Store(false)
	if err != nil {
		r.metrics.txAborted.Inc()
		return false, err
	}
	if !ok {
		r.metrics.txAborted.Inc()
		r.log.Info("transaction aborted; the batch will be consumed again", "records", len(b.inputs))
		if perr != nil {
			r.unw.Pause(ctx) // package refuse: no hot loop against a broker in trouble
		}
		return false, nil
	}
	r.metrics.txCommitted.Inc()
	r.observeCommitted(fetches) // lag.go
	r.unw.Committed(b.recs)     // package refuse
	return true, nil
}

// fenceWait bounds how long a commit waits for the assignment of the
// generation it commits in (ownedIn); past it, the transaction aborts.
const fenceWait = 2 * time.Second

// ownedIn returns the partitions this instance owns and the generation
// they were assigned in (txn.Fence's owner): at once if that generation is
// gen or later, or nothing is owned; else once the assignment callbacks of
// gen have run (a cooperative member's commit that waited for its rejoin is
// made in the new generation as soon as the join is done, a moment before
// them), for at most fenceWait.
func (r *Router) ownedIn(gen int32) ([]int32, int32) {
	deadline := time.Now().Add(fenceWait)
	for {
		owned, g := r.ownedWithGeneration()
		if g >= gen || len(owned) == 0 || time.Now().After(deadline) {
			return owned, g
		}
		time.Sleep(time.Millisecond)
	}
}

// joinWait bounds how long a commit waits for its instance's rejoin
// (awaitJoined): about a rebalance round; past it, the commit goes ahead
// and franz-go aborts it if the join completed meanwhile.
const joinWait = time.Second

// awaitJoined waits while this instance rejoins a cooperative group, for
// at most joinWait. franz-go prepares a transaction's offset commit in the
// group generation it is in, holds it while the member joins and syncs,
// and sends it then: a commit prepared during a join carries the
// generation the join just ended, and the broker refuses it
// (ILLEGAL_GENERATION), so every member's batch in flight at each round of
// a rebalance was aborted and routed again, also that of the partitions it
// keeps. Prepared after the join, in the new generation (ownedIn), it
// commits.
//
// A transaction that a revoke came in (revokedInTxn) does not wait: the
// session aborts it whatever the generation, and the partitions' next
// owner restores them only once the changelog has no open transaction, so
// waiting out the join first held every partition moved in a cooperative
// round for that much longer.
func (r *Router) awaitJoined(ctx context.Context) {
	deadline := time.Now().Add(joinWait)
	for r.rejoining.Load() && !r.revokedInTxn.Load() && ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}
