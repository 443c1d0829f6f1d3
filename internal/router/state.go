package router

// state.go is the task state of a batch: read once for every task of the
// batch before it is decided (loadStates, statesBefore), its changelog
// records queued in the batch's transaction (changelog), and the store
// written with the same bytes once that transaction has committed
// (writeCommitted, persist, waitWritten).

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// statesBefore puts in b.states the states of b's tasks that prev, the
// batch before whose store write may still run, committed: decoded from its
// changelog records, as the store will hold them. It returns the IDs of the
// tasks left to read from the store: neither touched nor forgotten by prev
// (a forgotten task starts afresh, as when the store no longer holds it).
// With no batch before (its write is done, or it did not commit), every ID
// is left to read. So it is after a rebalance since the batch before
// committed: a partition assigned again may have been restored from the
// changelog with states another instance committed meanwhile.
func (r *Router) statesBefore(prev, b *batch) ([]string, error) {
	if prev == nil {
		return b.ids, nil
	}
	if prev.rebalances != r.rebalances.Load() {
		// the store holds what the restore wrote once prev's write is done
		return b.ids, r.waitWritten()
	}
	ids := make([]string, 0, len(b.ids))
	for _, id := range b.ids {
		if _, ok := b.states[id]; ok {
			continue
		}
		if prev.forgotten[id] {
			continue
		}
		pt := prev.tasks[id]
		if pt == nil || !pt.touched || pt.encoded == nil {
			ids = append(ids, id)
			continue
		}
		st, err := r.codec.DecodeState(pt.encoded)
		if err != nil {
			return nil, fmt.Errorf("router: decode the state of %s committed by the batch before: %w", id, err)
		}
		b.states[id] = st
	}
	if slices.ContainsFunc(ids, prev.Touched) {
		// a touched state with no changelog record (it did not encode):
		// read it from the store once the write is done
		if err := r.waitWritten(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// writeLock is held while the Pebble write of a committed batch runs, like
// a sync.Mutex, but a wait for it ends when the store fails
// (LockUnless): a write that waits for a full disk waits for ever, and
// the session must still end and leave the group. The zero value is
// unlocked.
type writeLock struct {
	once sync.Once
	ch   chan struct{}
}

func (l *writeLock) c() chan struct{} {
	l.once.Do(func() { l.ch = make(chan struct{}, 1) })
	return l.ch
}

// Unlock releases the lock.
func (l *writeLock) Unlock() { <-l.c() }

// TryLock takes the lock if it is free.
func (l *writeLock) TryLock() bool {
	select {
	case l.c() <- struct{}{}:
		return true
	default:
		return false
	}
}

// LockUnless takes the lock unless failed is closed, before or while it
// waits (a nil failed never is), and reports whether it took it. Nothing
// is written to a store that failed: a write could wait for ever.
func (l *writeLock) LockUnless(failed <-chan struct{}) bool {
	select {
	case <-failed:
		return false
	default:
	}
	select {
	case l.c() <- struct{}{}:
		return true
	case <-failed:
		return false
	}
}

// storeFailed is closed once the store can no longer be written (nil
// without a store).
func (r *Router) storeFailed() <-chan struct{} {
	if r.store == nil {
		return nil
	}
	return r.store.Failed()
}

// beforeStateWrite, when set, runs before the Pebble write of each committed
// batch: a test holds the write back with it. Nil in production.
var beforeStateWrite func()

// waitWritten waits until the Pebble write of the last committed batch is
// done and returns its error, once.
func (r *Router) waitWritten() error {
	if !r.written.LockUnless(r.storeFailed()) {
		return r.store.Err() // the write may wait for the full disk for ever
	}
	defer r.written.Unlock()
	err := r.writeErr
	r.writeErr = nil
	return err
}

// changelog queues one state record per task the batch touched, its expiry
// stamped; persist stores the same bytes once the transaction commits.
func (r *Router) changelog(b *batch, now time.Time) {
	for _, t := range b.touched {
		id := t.id
		st := b.states[id]
		st.ExpiresAt = r.swp.ExpiresAt(st, now)
		var err error
		b.scratch, err = r.codec.EncodeStateFrom(b.scratch[:0], st, b.lastBody[st.LastEvent])
		if err != nil { // a State always encodes; keep the batch going regardless
			r.log.Error("state does not encode", "task_id", id, "err", err)
			continue
		}
		rec := b.mem.Record()
		rec.Topic, rec.Partition = r.cfg.Topics.State, t.part
		rec.Key = append(b.mem.Bytes(len(id)), id...)
		rec.Value = append(b.mem.Bytes(len(b.scratch)), b.scratch...)
		if !r.limits.Fits(rec) { // cannot happen within the bounds of pkg/task; never stop the partition for it
			r.log.Error("state record over the state topic's limit; keeping only what routing needs", "task_id", id, "bytes", len(rec.Value), "limit", r.limits.Of(rec.Topic))
			st.Shrink()
			rec.Value, _ = r.codec.EncodeState(nil, st)
		}
		t.encoded = rec.Value
		b.out = append(b.out, rec)
	}
}

// persist writes the committed states and changelog checkpoints to Pebble.
func (r *Router) persist(b *batch, now time.Time) error {
	size := 0 // a state's value, and its keys: task, member, owner and index entries, old ones deleted
	for _, t := range b.touched {
		size += len(t.encoded) + 12*len(t.id) + 128
	}
	wb := r.store.NewBatchSize(size)
	for _, t := range b.touched {
		st := b.states[t.id]
		var err error
		if t.encoded != nil {
			err = wb.PutEncoded(t.part, t.old, st, t.encoded)
		} else {
			err = wb.Put(t.part, t.old, st, r.swp.ExpiresAt(st, now))
		}
		if err != nil {
			wb.Discard()
			return err
		}
	}
	if err := r.swp.Forget(wb, b); err != nil {
		wb.Discard()
		return err
	}
	for p, next := range b.checkpoints {
		if err := wb.SetCheckpoint(p, next); err != nil {
			wb.Discard()
			return err
		}
	}
	return wb.Commit()
}

// writeCommitted writes a batch's states to the store once its transaction
// committed: now, and only now, the cache is updated. The write runs in the
// background while the next batch is polled, decoded and routed; that batch
// takes this one's states from b (statesBefore) and waits for the write
// before its sweep (waitWritten), and the assignment callbacks, which
// restore and mark the store, wait for it too. b is not reused until then:
// runSession alternates two batches. start is when the batch began, for
// faultrouter_batch_seconds.
func (r *Router) writeCommitted(b *batch, now, start time.Time) {
	if !r.written.LockUnless(r.storeFailed()) {
		return // the store failed: the run loop stops (Run)
	}
	r.writing = b
	go func() {
		defer r.written.Unlock()
		if beforeStateWrite != nil {
			beforeStateWrite()
		}
		if err := r.persist(b, now); err != nil {
			r.writeErr = err
			return
		}
		r.metrics.batchSeconds.Observe(time.Since(start).Seconds())
	}()
}

// loadStates puts in the batch the states of its tasks (dedup and the
// policy decide on them), with one batched read, and drops those that have
// expired (forgetExpired).
func (r *Router) loadStates(b *batch, now time.Time) error {
	// One batched read for every task of the poll. The batch before may still be written to the store (its write runs
	// after its commit, in the background): the states it committed are
	// read from its changelog records, the states it forgot are gone, and
	// only the other tasks, whose keys that write does not touch, are read
	// from the store. The sweep, which reads the time indexes, waits for
	// the write (waitWritten, in handle).
	prev := r.writing
	r.writing = nil
	b.routedIDs()
	ids, err := r.statesBefore(prev, b)
	if err != nil {
		return err
	}
	if err := r.store.Load(ids, b.partition, b.states); err != nil {
		return err
	}
	r.swp.ForgetExpired(b, now) // package sweep: an event after expiry starts fresh
	return nil
}
