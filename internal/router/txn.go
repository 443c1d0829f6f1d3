package router

// txn.go is the produce and commit step of the data path: one Kafka
// transaction per batch.

import (
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// txn is one batch's Kafka transaction (handle.go). The transaction of a
// batch with input begins before its first decision, and each record is
// produced as soon as it is queued (records are final once queued), so the
// broker writes the first records while the rest are decided, and the flush
// that ends the transaction waits only for the last ones. It notes the
// changelog offsets the batch's state records got (the checkpoints the
// store is written with) and the records the broker refused.
type txn struct {
	sess       *kgo.GroupTransactSession
	b          *batch
	stateTopic string
	open       bool // the transaction has begun
	produced   int  // b.out[:produced] are produced
	promise    func(*kgo.Record, error)

	// the promises run in the client's goroutines
	mu     sync.Mutex
	err    error // the first produce error
	failed map[*kgo.Record]error
}

func newTxn(sess *kgo.GroupTransactSession, b *batch, stateTopic string) *txn {
	t := &txn{sess: sess, b: b, stateTopic: stateTopic, failed: map[*kgo.Record]error{}}
	t.promise = t.done
	return t
}

// begin begins the transaction, once.
func (t *txn) begin() error {
	if t.open {
		return nil
	}
	if err := t.sess.Begin(); err != nil {
		return fmt.Errorf("router: begin transaction: %w", err)
	}
	t.open = true
	return nil
}

// produce produces the records the batch queued since the last call.
func (t *txn) produce(ctx context.Context) {
	for _, rec := range t.b.out[t.produced:] {
		t.sess.Produce(ctx, rec, t.promise)
	}
	t.produced = len(t.b.out)
}

// done is the promise of each produced record.
func (t *txn) done(rec *kgo.Record, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.err == nil {
			t.err = err
		}
		t.failed[rec] = err
		return
	}
	if rec.Topic == t.stateTopic && rec.Offset+1 > t.b.checkpoints[rec.Partition] {
		t.b.checkpoints[rec.Partition] = rec.Offset + 1
	}
}

// end flushes the batch's records and ends its transaction: it commits
// unless a record failed, fenced by the group (fence.go). It reports
// whether the transaction committed; a batch whose transaction did not is
// consumed again.
func (r *Router) end(ctx context.Context, t *txn, fetches kgo.Fetches) (committed bool, err error) {
	b := t.b
	try := kgo.TryCommit
	if err := t.sess.Client().Flush(ctx); err != nil {
		return false, fmt.Errorf("router: flush: %w", err)
	}
	if t.err != nil {
		r.log.Warn("produce failed; aborting the transaction", "err", t.err)
		try = kgo.TryAbort
		r.unw.remember(t.failed, b.origins()) // unwritable.go: dead-lettered when polled again
	}
	b.rebalances = r.rebalances.Load() // before the commit: a rebalance after it may replace its states
	ok, err := t.sess.End(kgo.PreTxnCommitFnContext(ctx, r.fence(t.sess.Client())), try)
	if err != nil {
		r.metrics.txAborted.Inc()
		return false, fmt.Errorf("router: end transaction: %w", err)
	}
	if !ok {
		r.metrics.txAborted.Inc()
		r.log.Info("transaction aborted; the batch will be consumed again", "records", len(b.inputs))
		if t.err != nil {
			r.unw.pause(ctx) // unwritable.go: no hot loop against a broker in trouble
		}
		return false, nil
	}
	r.metrics.txCommitted.Inc()
	r.observeCommitted(fetches) // lag.go
	r.unw.committed(b)          // unwritable.go
	return true, nil
}
