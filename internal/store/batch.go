package store

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Batch collects the writes of one poll: states, index entries and
// checkpoints, applied together without fsync.
type Batch struct {
	s     *Store
	b     *pebble.Batch
	buf   []byte
	key   []byte // the scratch of batchWriter.keyBuf
	codec *codec.Codec
	added map[floorKey]int64 // the earliest index entry written, per index (Store.floors)
}

// NewBatch returns an empty batch.
func (s *Store) NewBatch() *Batch { return &Batch{s: s, b: s.db.NewBatch(), codec: s.codec} }

// NewBatchSize returns an empty batch with room for about size bytes of
// keys and values, so that a large batch is not grown (and copied) step by
// step.
func (s *Store) NewBatchSize(size int) *Batch {
	return &Batch{s: s, b: s.db.NewBatchWithSize(size), codec: s.codec}
}

// Put writes the new state of a task of partition p. old is the state the
// store held before (nil for a new task); its index entries are replaced.
// expiresAt is the router-clock time (ms) the state expires, 0 for never.
func (b *Batch) Put(p int32, old, st *task.State, expiresAt int64) error {
	// the stored state carries its expiry: the next Put's old state names the
	// index entry to replace, and the sweep re-checks it
	st.ExpiresAt = expiresAt
	v, err := b.codec.EncodeState(nil, st)
	if err != nil {
		return fmt.Errorf("store: encode state of %s: %w", st.TaskID, err)
	}
	return b.PutEncoded(p, old, st, v)
}

// PutEncoded is Put for a state that is already encoded: v is
// codec.EncodeState of st (or the JSON of an earlier build) with st.ExpiresAt set to the state's expiry (0 for never), e.g. the value
// of its changelog record. The bytes are stored as they are, so a state is
// encoded once for the changelog and the store.
func (b *Batch) PutEncoded(p int32, old, st *task.State, v []byte) error {
	if b.added == nil {
		b.added = map[floorKey]int64{}
	}
	add := func(prefix byte, at int64) {
		k := floorKey{prefix, p}
		if a, ok := b.added[k]; !ok || at < a {
			b.added[k] = at
		}
	}
	if st.Pending != nil {
		add('d', st.Pending.NotBefore)
	}
	if st.ExpiresAt > 0 {
		add('x', st.ExpiresAt/b.s.bucketMs)
	}
	if overdueIndexed(st) {
		add('o', st.ReviewDueAt)
	}
	return putEncoded(batchWriter{b.b, b.s.bucketMs, &b.key}, p, old, st, v)
}

// writer is where the writes of a state go: a Pebble batch, or a Bulk.
// keyBuf returns an empty buffer with room for n bytes for the next key:
// a Pebble batch copies the keys it is given, a Bulk keeps them.
type writer interface {
	Set(key, value []byte, _ *pebble.WriteOptions) error
	Delete(key []byte, _ *pebble.WriteOptions) error
	keyBuf(n int) []byte
	// bucket is the expiry bucket holding time ms (Options.ExpiryBucket)
	bucket(ms int64) int64
}

// batchWriter is a Pebble batch as a writer. Its keys are built in one
// scratch buffer, key: a Pebble batch copies a key as it is given it.
type batchWriter struct {
	*pebble.Batch
	bucketMs int64
	key      *[]byte
}

func (w batchWriter) keyBuf(n int) []byte {
	if cap(*w.key) < n {
		*w.key = make([]byte, 0, max(n, 64))
	}
	return (*w.key)[:0]
}

func (w batchWriter) bucket(ms int64) int64 { return ms / w.bucketMs }

// Entries names the entries a task state has in the store's indexes (due
// retries, expiry, overdue review items): what a write of the task's next
// state replaces.
type Entries struct {
	Pending   bool  // a retry is pending: the state has a due-index entry
	NotBefore int64 // the pending retry's not-before time
	Due       int64 // the pending retry's own due time (task.PendingRetry.Due)
	ExpiresAt int64 // the state's expiry, 0 for never
	OverdueAt int64 // the deadline of an open review item not alerted yet, 0 for none
}

// EntriesOf returns the index entries of st.
func EntriesOf(st *task.State) Entries {
	x := Entries{ExpiresAt: st.ExpiresAt}
	if st.Pending != nil {
		x.Pending, x.NotBefore, x.Due = true, st.Pending.NotBefore, st.Pending.Due()
	}
	if overdueIndexed(st) {
		x.OverdueAt = st.ReviewDueAt
	}
	return x
}

func putEncoded(w writer, p int32, old, st *task.State, v []byte) error {
	var ox *Entries
	if old != nil {
		x := EntriesOf(old)
		ox = &x
	}
	return putIndexed(w, p, st.TaskID, ox, EntriesOf(st), v)
}

// putIndexed writes the encoded state v of task id, of partition p, with
// its index entries x, replacing the index entries old of the state the
// store held (nil for none). An entry of old whose key x writes again (the
// expiry bucket of most writes) is not deleted first: the write replaces
// it, and a deletion would be one more entry in the memtable and in the
// tables flushed from it.
func putIndexed[I taskID](w writer, p int32, id I, old *Entries, x Entries, v []byte) error {
	if old != nil {
		o := *old
		if o.Pending && x.Pending && o.NotBefore == x.NotBefore && o.Due == x.Due {
			o.Pending = false
		}
		if o.ExpiresAt > 0 && x.ExpiresAt > 0 && w.bucket(o.ExpiresAt) == w.bucket(x.ExpiresAt) {
			o.ExpiresAt = 0
		}
		if o.OverdueAt > 0 && o.OverdueAt == x.OverdueAt {
			o.OverdueAt = 0
		}
		unindex(w, p, id, &o)
	}
	if err := w.Set(appendTaskKey(w.keyBuf(taskKeyLen+len(id)), p, id), v, nil); err != nil {
		return err
	}
	if x.Pending {
		if err := w.Set(appendDueKey(w.keyBuf(22+len(id)), p, x.NotBefore, x.Due, id), nil, nil); err != nil {
			return err
		}
	}
	if x.ExpiresAt > 0 {
		if err := w.Set(appendTimeKey(w.keyBuf(14+len(id)), 'x', p, w.bucket(x.ExpiresAt), id), nil, nil); err != nil {
			return err
		}
	}
	if x.OverdueAt > 0 {
		if err := w.Set(appendTimeKey(w.keyBuf(14+len(id)), 'o', p, x.OverdueAt, id), nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// overdueIndexed reports whether a state belongs in the overdue-review index:
// an open review item whose SLA alert has not been raised.
func overdueIndexed(st *task.State) bool { return overdue(st.Review, st.ReviewDueAt, st.ReviewAlerted) }

func overdue(review string, dueAt int64, alerted bool) bool {
	return review == task.ReviewOpen && dueAt > 0 && !alerted
}

// EntriesOfIndex returns the index entries of a state read with
// codec.DecodeStateIndex: EntriesOf without the whole state.
func EntriesOfIndex(x *codec.StateIndex) Entries {
	e := Entries{ExpiresAt: x.ExpiresAt}
	if x.Pending {
		e.Pending, e.NotBefore, e.Due = true, x.Retry.NotBefore, x.Retry.Due()
	}
	if overdue(x.Review, x.ReviewDueAt, x.ReviewAlerted) {
		e.OverdueAt = x.ReviewDueAt
	}
	return e
}

// Delete removes a task and its index entries.
func (b *Batch) Delete(p int32, old *task.State) error {
	return deleteTask(batchWriter{b.b, b.s.bucketMs, &b.key}, p, old)
}

func deleteTask(w writer, p int32, old *task.State) error {
	if old == nil {
		return nil
	}
	x := EntriesOf(old)
	return deleteIndexed(w, p, old.TaskID, &x)
}

// deleteIndexed removes task id, of partition p, and the index entries old
// of its stored state (nil: the store holds nothing of it).
func deleteIndexed[I taskID](w writer, p int32, id I, old *Entries) error {
	if old == nil {
		return nil
	}
	unindex(w, p, id, old)
	return w.Delete(appendTaskKey(w.keyBuf(taskKeyLen+len(id)), p, id), nil)
}

func unindex[I taskID](w writer, p int32, id I, old *Entries) {
	if old == nil {
		return
	}
	if old.Pending {
		_ = w.Delete(appendDueKey(w.keyBuf(22+len(id)), p, old.NotBefore, old.Due, id), nil)
	}
	if old.ExpiresAt > 0 {
		_ = w.Delete(appendTimeKey(w.keyBuf(14+len(id)), 'x', p, w.bucket(old.ExpiresAt), id), nil)
	}
	if old.OverdueAt > 0 {
		_ = w.Delete(appendTimeKey(w.keyBuf(14+len(id)), 'o', p, old.OverdueAt, id), nil)
	}
}

// SetCheckpoint records that the changelog of partition p is applied up to
// (not including) offset next.
func (b *Batch) SetCheckpoint(p int32, next int64) error {
	b.buf = binary.BigEndian.AppendUint64(b.buf[:0], uint64(next))
	return b.b.Set(checkpointKey(p), b.buf, nil)
}

// Len is the number of writes in the batch.
func (b *Batch) Len() int { return int(b.b.Count()) }

// Commit applies the batch without fsync and releases it.
func (b *Batch) Commit() error {
	defer b.b.Close()
	if err := b.b.Commit(pebble.NoSync); err != nil {
		err = fmt.Errorf("store: commit batch: %w", err)
		if b.s != nil {
			b.s.check(err)
		}
		return err
	}
	if b.s != nil {
		b.s.lowerFloors(b.added)
	}
	return nil
}

// Discard releases the batch without applying it.
func (b *Batch) Discard() { b.b.Close() }

// taskID is a task ID as a string, or as the bytes of a record's key.
type taskID interface{ ~string | ~[]byte }

// taskKeyLen is the length of a task key before the task ID.
const taskKeyLen = 6

// taskKey holds the state of task id of partition p: t/<p:4><id>.
func taskKey(p int32, id string) []byte {
	return appendTaskKey(make([]byte, 0, taskKeyLen+len(id)), p, id)
}

func appendTaskKey[I taskID](dst []byte, p int32, id I) []byte {
	return append(binary.BigEndian.AppendUint32(append(dst, 't', '/'), uint32(p)), id...)
}

func checkpointKey(p int32) []byte {
	return binary.BigEndian.AppendUint32([]byte("c/"), uint32(p))
}

// dueKey is a key of the due index: d/<p:4><not_before:8><due:8><id>. Among
// retries with the same not-before time (held behind a breaker, moved to when
// it is worth asking again) the retry's own due time comes first, then the
// task ID.
func dueKey(p int32, notBefore, due int64, id string) []byte {
	return appendDueKey(make([]byte, 0, 22+len(id)), p, notBefore, due, id)
}

func appendDueKey[I taskID](dst []byte, p int32, notBefore, due int64, id I) []byte {
	k := append(dst, 'd', '/')
	k = binary.BigEndian.AppendUint32(k, uint32(p))
	k = binary.BigEndian.AppendUint64(k, uint64(notBefore))
	k = binary.BigEndian.AppendUint64(k, uint64(due))
	return append(k, id...)
}

func overdueKey(p int32, deadline int64, id string) []byte { return timeKey('o', p, deadline, id) }

// timeKey is a key of a per-partition time index: <prefix>/<p:4><at:8><id>.
func timeKey(prefix byte, p int32, at int64, id string) []byte {
	return appendTimeKey(make([]byte, 0, 14+len(id)), prefix, p, at, id)
}

func appendTimeKey[I taskID](dst []byte, prefix byte, p int32, at int64, id I) []byte {
	k := append(dst, prefix, '/')
	k = binary.BigEndian.AppendUint32(k, uint32(p))
	k = binary.BigEndian.AppendUint64(k, uint64(at))
	return append(k, id...)
}

func expiryKey(p int32, bucket int64, id string) []byte { return timeKey('x', p, bucket, id) }

// releasedKey holds the release mark of partition p (Release): e/<p:4> ->
// <offset:8><unix ms:8><checkpoint:8> (<offset:8> alone in a mark of an
// earlier release).
func releasedKey(p int32) []byte {
	return binary.BigEndian.AppendUint32([]byte("e/"), uint32(p))
}
