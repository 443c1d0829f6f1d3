// Package txn is the produce and commit step of the router's data path:
// one Kafka transaction per batch (Txn), fenced by the consumer group
// (Fence).
package txn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Batch is the batch a transaction produces: the records it queued so far,
// and the changelog checkpoints its state records got.
type Batch interface {
	// Out returns the records the batch queued so far, in order.
	Out() []*kgo.Record
	// Checkpoint records that the batch's changelog records of partition
	// p reach up to next (the offset after the last): called from the
	// client's goroutines, one at a time.
	Checkpoint(p int32, next int64)
}

// Txn is one batch's Kafka transaction (the router's handle.go). The transaction of a
// batch with input begins before its first decision, and each record is
// produced as soon as it is queued (records are final once queued), so the
// broker writes the first records while the rest are decided, and the flush
// that ends the transaction waits only for the last ones. It notes the
// changelog offsets the batch's state records got (the checkpoints the
// store is written with) and the records the broker refused.
type Txn struct {
	sess       *kgo.GroupTransactSession
	b          Batch
	stateTopic string
	open       bool // the transaction has begun
	produced   int  // b.Out()[:produced] are produced
	promise    func(*kgo.Record, error)

	// the promises run in the client's goroutines
	mu     sync.Mutex
	err    error // the first produce error
	failed map[*kgo.Record]error
}

// New returns the transaction of batch b in session sess; stateTopic is the
// changelog whose offsets are b's checkpoints.
func New(sess *kgo.GroupTransactSession, b Batch, stateTopic string) *Txn {
	t := &Txn{sess: sess, b: b, stateTopic: stateTopic, failed: map[*kgo.Record]error{}}
	t.promise = t.done
	return t
}

// Begin begins the transaction, once.
func (t *Txn) Begin() error {
	if t.open {
		return nil
	}
	if err := t.sess.Begin(); err != nil {
		return fmt.Errorf("router: begin transaction: %w", err)
	}
	t.open = true
	return nil
}

// Produce produces the records the batch queued since the last call.
func (t *Txn) Produce(ctx context.Context) {
	out := t.b.Out()
	for _, rec := range out[t.produced:] {
		t.sess.Produce(ctx, rec, t.promise)
	}
	t.produced = len(out)
}

// done is the promise of each produced record.
func (t *Txn) done(rec *kgo.Record, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.err == nil {
			t.err = err
		}
		t.failed[rec] = err
		return
	}
	if rec.Topic == t.stateTopic {
		t.b.Checkpoint(rec.Partition, rec.Offset+1)
	}
}

// Flush waits until every record produced has been acknowledged or
// refused; then Refused tells the refusals.
func (t *Txn) Flush(ctx context.Context) error {
	if err := t.sess.Client().Flush(ctx); err != nil {
		return fmt.Errorf("router: flush: %w", err)
	}
	return nil
}

// Refused returns every record the broker refused, with its error, and the
// first of those errors (none: nil).
func (t *Txn) Refused() (map[*kgo.Record]error, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed, t.err
}

// End ends the transaction: it commits (try kgo.TryCommit) with fence
// completing the offset commit (Fence), or aborts. It reports whether the
// transaction committed.
func (t *Txn) End(ctx context.Context, fence func(*kmsg.TxnOffsetCommitRequest) error, try kgo.TransactionEndTry) (bool, error) {
	ok, err := t.sess.End(kgo.PreTxnCommitFnContext(ctx, fence), try)
	if err != nil {
		return false, fmt.Errorf("router: end transaction: %w", err)
	}
	return ok, nil
}

// EndAlone ends a transaction that consumed nothing and holds no
// partition's state or offsets (an instance that owns no partition) on the
// client, not through the group session: it commits (try kgo.TryCommit) or
// aborts it, and reports whether it committed. The session's End of a
// transaction that commits no offsets holds the session's lock, and with it
// the group's revoke callback, for half a second after the commit (franz-go
// gives brokers without KIP-447 that time to write the markers), and a
// member that owns nothing while the group's second cooperative round is
// under way held that round up by as much. Such a transaction needs no
// fencing by the group (Fence).
func (t *Txn) EndAlone(ctx context.Context, try kgo.TransactionEndTry) (bool, error) {
	cl := t.sess.Client()
	if try == kgo.TryAbort {
		if err := cl.AbortBufferedRecords(ctx); err != nil {
			return false, fmt.Errorf("router: abort buffered records: %w", err)
		}
	}
	err := cl.EndTransaction(ctx, try)
	if err != nil && try == kgo.TryCommit &&
		(errors.Is(err, kerr.OperationNotAttempted) || errors.Is(err, kerr.TransactionAbortable)) {
		try, err = kgo.TryAbort, cl.EndTransaction(ctx, kgo.TryAbort)
	}
	if err != nil {
		return false, fmt.Errorf("router: end transaction: %w", err)
	}
	return bool(try), nil
}

// Client is the session's client.
func (t *Txn) Client() *kgo.Client { return t.sess.Client() }
