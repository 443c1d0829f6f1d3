package router

// txn.go ends a batch's transaction (package txn produces it): it commits
// unless a record failed, fenced by the group (txn.Fence), and counts and
// logs what happened.

import (
	"context"

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
	owned, gen := r.ownedWithGeneration()
	var ok bool
	if len(owned) == 0 && b.began == b.rebalances && fetches.NumRecords() == 0 {
		// it consumed nothing, and this instance owned no partition while
		// it ran: it writes no partition's state or retries, and needs no
		// group session (txn.EndAlone)
		ok, err = t.EndAlone(ctx, try)
	} else {
		fence := txn.Fence(owned, gen, []string{r.cfg.Topics.Ingress, r.cfg.Topics.Decisions}, t.Client())
		ok, err = t.End(ctx, fence, try)
	}
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
