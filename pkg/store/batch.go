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
		add('x', bucketOf(st.ExpiresAt))
	}
	if overdueIndexed(st) {
		add('o', st.ReviewDueAt)
	}
	return putEncoded(b.b, p, old, st, v)
}

// writer is where the writes of a state go: a Pebble batch, or a Bulk.
type writer interface {
	Set(key, value []byte, _ *pebble.WriteOptions) error
	Delete(key []byte, _ *pebble.WriteOptions) error
}

func putEncoded(w writer, p int32, old, st *task.State, v []byte) error {
	unindex(w, p, old)
	expiresAt := st.ExpiresAt
	if err := w.Set(taskKey(st.TaskID), v, nil); err != nil {
		return err
	}
	// which partition the task belongs to, both ways: WipePartition finds
	// the tasks of a partition, and deletes only those still of it
	if err := w.Set(memberKey(p, st.TaskID), nil, nil); err != nil {
		return err
	}
	if err := w.Set(ownerKey(st.TaskID), binary.BigEndian.AppendUint32(nil, uint32(p)), nil); err != nil {
		return err
	}
	if st.Pending != nil {
		if err := w.Set(dueKey(p, st.Pending.NotBefore, st.Pending.Due(), st.TaskID), nil, nil); err != nil {
			return err
		}
	}
	if expiresAt > 0 {
		if err := w.Set(expiryKey(p, bucketOf(expiresAt), st.TaskID), nil, nil); err != nil {
			return err
		}
	}
	if overdueIndexed(st) {
		if err := w.Set(overdueKey(p, st.ReviewDueAt, st.TaskID), nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// overdueIndexed reports whether a state belongs in the overdue-review index:
// an open review item whose SLA alert has not been raised.
func overdueIndexed(st *task.State) bool {
	return st.Review == task.ReviewOpen && st.ReviewDueAt > 0 && !st.ReviewAlerted
}

// Delete removes a task and its index entries.
func (b *Batch) Delete(p int32, old *task.State) error { return deleteTask(b.b, p, old) }

func deleteTask(w writer, p int32, old *task.State) error {
	if old == nil {
		return nil
	}
	unindex(w, p, old)
	if err := w.Delete(memberKey(p, old.TaskID), nil); err != nil {
		return err
	}
	if err := w.Delete(ownerKey(old.TaskID), nil); err != nil {
		return err
	}
	return w.Delete(taskKey(old.TaskID), nil)
}

func unindex(w writer, p int32, old *task.State) {
	if old == nil {
		return
	}
	if old.Pending != nil {
		_ = w.Delete(dueKey(p, old.Pending.NotBefore, old.Pending.Due(), old.TaskID), nil)
	}
	if old.ExpiresAt > 0 {
		_ = w.Delete(expiryKey(p, bucketOf(old.ExpiresAt), old.TaskID), nil)
	}
	if overdueIndexed(old) {
		_ = w.Delete(overdueKey(p, old.ReviewDueAt, old.TaskID), nil)
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
		return fmt.Errorf("store: commit batch: %w", err)
	}
	if b.s != nil {
		b.s.lowerFloors(b.added)
	}
	return nil
}

// Discard releases the batch without applying it.
func (b *Batch) Discard() { b.b.Close() }

// bucketOf is the expiry bucket (an hour) holding time ms.
func bucketOf(ms int64) int64 { return ms / 3_600_000 }

func taskKey(id string) []byte { return append([]byte("t/"), id...) }

func checkpointKey(p int32) []byte {
	return binary.BigEndian.AppendUint32([]byte("c/"), uint32(p))
}

// dueKey is a key of the due index: d/<p:4><not_before:8><due:8><id>. Among
// retries with the same not-before time (held behind a breaker, moved to when
// it is worth asking again) the retry's own due time comes first, then the
// task ID.
func dueKey(p int32, notBefore, due int64, id string) []byte {
	k := append(make([]byte, 0, 22+len(id)), 'd', '/')
	k = binary.BigEndian.AppendUint32(k, uint32(p))
	k = binary.BigEndian.AppendUint64(k, uint64(notBefore))
	k = binary.BigEndian.AppendUint64(k, uint64(due))
	return append(k, id...)
}

func overdueKey(p int32, deadline int64, id string) []byte { return timeKey('o', p, deadline, id) }

// timeKey is a key of a per-partition time index: <prefix>/<p:4><at:8><id>.
func timeKey(prefix byte, p int32, at int64, id string) []byte {
	k := append(make([]byte, 0, 14+len(id)), prefix, '/')
	k = binary.BigEndian.AppendUint32(k, uint32(p))
	k = binary.BigEndian.AppendUint64(k, uint64(at))
	return append(k, id...)
}

func expiryKey(p int32, bucket int64, id string) []byte { return timeKey('x', p, bucket, id) }

// memberKey lists task id as a task of partition p: m/<p:4><id>.
func memberKey(p int32, id string) []byte {
	return append(binary.BigEndian.AppendUint32([]byte("m/"), uint32(p)), id...)
}

// ownerKey holds the partition a task belongs to: r/<id> -> <p:4>.
func ownerKey(id string) []byte { return append([]byte("r/"), id...) }

// releasedKey holds the changelog end offset of partition p when this
// instance last released it: e/<p:4> -> <offset:8>.
func releasedKey(p int32) []byte {
	return binary.BigEndian.AppendUint32([]byte("e/"), uint32(p))
}
