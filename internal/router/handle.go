package router

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/txn"
)

// handle.go is the data path of one batch, top to bottom: each step is a
// call into the part that owns it (docs/data-path.md has the table of the
// parts and what each imports of the others).
//
//   consume, decode        package decode (Decoder, Normalizer), package
//                          refuse (Refusals: what the broker refused)
//   dedup and task state   state.go, batch.go
//   decide and route       decide.go (pkg/policy decides; package emit
//                          builds the records), package forward
//   hold and release       package hold (Breakers)
//   expiry and the sweep   package sweep (Sweeper)
//   produce and commit     package txn (Txn), txn.go; the store written
//                          after the commit (state.go)

// handle routes one poll batch in one Kafka transaction:
// consume -> decode -> dedup -> classify/decide -> produce -> commit, then
// updates the Pebble cache once the transaction has committed, in the
// background while the next batch is polled, decoded and routed
// (statesBefore, waitWritten). It reports whether the batch's transaction
// committed.
func (r *Router) handle(ctx context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches, b *batch) (committed bool, err error) {
	b.reset()
	now := r.cfg.Now()
	start := time.Now()
	// package hold: the batch's breaker changes are kept only if it commits
	r.brk.Begin(now)
	rebalances := r.rebalanceCount()
	b.began = rebalances
	r.brk.AdoptShared(b, now) // package hold: the other instances' breaker changes
	defer func() {
		if committed {
			r.brk.Commit()
		} else {
			r.brk.Rollback()
		}
		r.fwd.PartitionsCommitted(b.parts, sess.Client(), committed) // package forward
	}()

	// consume and decode (package decode, input.go)
	if err := r.decodeBatch(ctx, fetches, b); err != nil {
		return false, err
	}
	// dedup and task state: the batch's task states, read once (state.go)
	if err := r.loadStates(b, now); err != nil {
		return false, err
	}

	// the transaction begins before the batch's first decision (package txn)
	tx := txn.New(sess, b, r.cfg.Topics.State)
	if len(b.inputs) > 0 {
		if err := tx.Begin(); err != nil {
			return false, err
		}
	}

	// classify and decide, in input order, per task on the evolving state
	for i := range b.inputs {
		n := len(b.out)
		r.route(&b.inputs[i], b, now)
		b.outOf = append(b.outOf, [2]int32{int32(n), int32(len(b.out))})
		r.observe(&b.inputs[i], b, now) // package hold: outcomes, transitions, alerts
		tx.Produce(ctx)
	}
	// the batch before is in the store before its time indexes are read
	if err := r.waitWritten(); err != nil {
		return false, err
	}
	// package hold: an assignment that came during the batch is read to
	// the breakers topic's end before it publishes, and what was read
	// meanwhile adopted
	if r.rebalanceCount() != rebalances {
		r.brk.AdoptShared(b, now)
	}
	if r.brk.Publishing(r.readyGauge) {
		// package hold: retries held behind breakers that have closed come first
		if err := r.brk.ReleaseHeld(b.states, b.Load, now); err != nil {
			return false, err
		}
		// package sweep: expiry, due retries and owner SLA alerts on the partitions
		// this instance owns, from one sweep over their time indexes
		if err := r.swp.Sweep(b, now); err != nil {
			return false, err
		}
		// decide.go: the due retries of the batch's tasks, unless a breaker
		// holds them
		if err := r.publishDue(b, now); err != nil {
			return false, err
		}
	}
	b.parts = r.fwd.WatchPartitions(ctx, sess.Client(), b, now) // package forward: partitions added at runtime
	if len(b.inputs) == 0 && len(b.touched) == 0 && len(b.expired) == 0 && len(b.out) == 0 {
		committed = true // nothing to write: keep what the passing of time changed
		return true, nil
	}
	r.changelog(b, now)

	// produce the rest and commit: one transaction
	if err := tx.Begin(); err != nil {
		return false, err
	}
	tx.Produce(ctx)
	if beforeCommit != nil {
		beforeCommit(b)
	}
	if ok, err := r.end(ctx, tx, b, fetches); !ok || err != nil {
		return false, err
	}
	committed = true

	r.writeCommitted(b, now, start) // state.go: the store, in the background
	r.countCommitted(b)             // metrics.go: metrics and decision logs
	b.releaseRecords()
	return true, nil
}

// beforeCommit, when set, runs before each batch's commit: a test stops
// the router there. Nil in production.
var beforeCommit func(b *batch)
