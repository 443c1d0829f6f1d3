// Package store keeps the router's task state in Pebble on a local
// directory. Pebble is a cache of the compacted changelog topic: the router
// writes to it only after the Kafka transaction that carried the same state
// committed, and restores it from the changelog on start and on every
// partition assignment, from the checkpoint offset kept here. A poll's
// writes are never fsynced (the changelog is the durable copy); bloom
// filters make the point reads of a poll cheap.
//
// Two ways to write. A Batch (a poll's writes) goes into Pebble's memtable,
// with no write-ahead log (Options.DisableWAL) and no fsync: the changelog
// is the durable copy. A killed process comes back with an earlier copy of
// the store, what its flushed memtables held (Pebble flushes them in order,
// a batch whole, so the copy is consistent), and that is never trusted
// beyond what the changelog says: a partition is trusted only with a
// release mark, and only while the changelog has not moved since the mark
// (below), so a copy that lost writes after its mark is wiped and restored
// like any other. Close flushes the memtables, so a clean stop keeps
// everything. Writing the WAL cost the router about a twentieth of its CPU
// an event (a write system call per poll, and the copy). A Bulk (a
// restore's writes) is sorted and written as synced sstables that Pebble
// ingests: no memtable, no flush. It is durable once committed, and atomic
// like a batch: the restore's checkpoint goes in with the states it covers.
//
// Key layout (all integers big-endian, so that keys sort by them):
//
//	t/<partition:4><task_id>             -> task.State
//	c/<partition:4>                      -> next changelog offset to restore from
//	d/<partition:4><not_before:8><due:8><task_id> -> due index of pending retries
//	x/<partition:4><bucket:8><task_id>   -> expiry index (bucket = expiry / Options.ExpiryBucket)
//	o/<partition:4><deadline:8><task_id> -> open review items by SLA deadline
//	e/<partition:4>                      -> changelog end when the partition was released
//	v                                    -> key layout version
//
// Every key of a task starts with its partition (the changelog partition
// its state is on, the partition of the records that changed it), so the
// keys of one partition are a few key ranges: a partition is wiped with
// range deletes, and a restore of whole partitions writes sstables that
// overlap nothing the store holds of other partitions. A task has two keys
// (its state and its expiry entry), and one more in each index it is in.
//
// The state of a partition is trusted only while this instance holds the
// partition without a gap: a partition it gets back (after a restart, or
// after another instance held it) is wiped (WipePartition) and restored from
// the changelog's start, unless this instance released it cleanly
// (SetReleased) and the changelog's records since can still all be read
// (package restore catches the state up from them). Otherwise state the
// changelog no longer holds (a task another owner finished and compaction
// then dropped with its tombstone) would come back from the local copy.
//
// A store whose disk is full (or whose quota is reached, or whose file
// system went read-only) fails for good at the first write, flush or
// compaction that finds it so (Err, Failed): Pebble would retry the flush
// for as long as the disk stays full, and every write would wait once the
// memtables are full. Its owner stops; the changelog holds every state.
package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Store is the Pebble-backed task state of one router instance.
type Store struct {
	db   *pebble.DB
	dir  string
	opts *pebble.Options // as opened: Bulk writes sstables with them
	log  *slog.Logger

	// the sstables of committed Bulks are synced in the background (see
	// unsyncedMark): how many Bulks are, and the goroutines doing it
	syncMu  sync.Mutex
	syncing int
	syncs   sync.WaitGroup
	codec   *codec.Codec // states are TaskState records (codec.EncodeState)

	// floors are, per time index and partition, a time at or before every
	// entry of the index (a scan's lower bound): a scan that finds the index
	// empty up to now, or its first entry at t, raises it, so that the next
	// scan does not step again over the deleted entries before it (a held
	// retry moved to a later time leaves one on every move, until Pebble
	// compacts them away). A write of an entry before it lowers it.
	mu     sync.Mutex
	floors map[floorKey]floor
	resets uint64 // how many times resetFloors ran

	bucketMs int64 // the width of an expiry bucket (Options.ExpiryBucket)

	// failed is closed, and failErr set, once the store cannot be written
	// (Err): its disk is full, its quota reached or it was remounted
	// read-only, or its flushes or compactions have kept failing for
	// FlushFailLimit.
	// Pebble retries a flush that failed for as long as it fails, and
	// stops every write once its memtables are full; the router stops
	// instead, and the changelog keeps every state.
	failOnce sync.Once
	failed   chan struct{}
	failErr  error
	bgErrors atomic.Int64 // background errors, failures or not
	bgLogged atomic.Int64 // when one was last logged at error level, Unix ns
	// flushFailing and compactFailing are when the flushes and the
	// compactions began to fail, in Unix nanoseconds (0: the last one was
	// done); flushFailLimit is Options.FlushFailLimit, for both
	flushFailing   atomic.Int64
	compactFailing atomic.Int64
	flushFailLimit time.Duration
}

// Options are the store's optional settings.
type Options struct {
	// ExpiryBucket is the width of the expiry index's buckets: a task is
	// forgotten once the bucket holding its expiry is over, so at most one
	// bucket after it expired (an event for it is decided on a fresh state
	// from its expiry on, whether or not it was forgotten yet), and a
	// state's expiry entry is rewritten only when its expiry moves to
	// another bucket. Default (0) one hour. The width is part of the key
	// layout: a store opened with another width is emptied and restored
	// from the changelog.
	ExpiryBucket time.Duration
	// FS is the file system the store is on. Default (nil): the
	// operating system's.
	FS vfs.FS
	// MemTableSize is the size of one of Pebble's memtables (two are
	// kept). Default (0): 32 MiB.
	MemTableSize uint64
	// FlushFailLimit is how long Pebble's flushes, or its compactions, may
	// keep failing, none done in between, before the store fails (Err)
	// whatever the error: a memtable that cannot be flushed holds every
	// write once the memtables are full, and tables that cannot be
	// compacted out of L0 hold every write once L0 has too many.
	// Default (0): DefaultFlushFailLimit.
	FlushFailLimit time.Duration
}

// DefaultFlushFailLimit is Options.FlushFailLimit when it is left 0: long
// enough for a volume that stalls for a few seconds, short enough that the
// partitions move to another instance well within a minute.
const DefaultFlushFailLimit = 30 * time.Second

// DefaultExpiryBucket is the expiry buckets' width when Options leave it 0.
const DefaultExpiryBucket = time.Hour

type floorKey struct {
	prefix byte
	p      int32
}

// floor is an index's lower bound and how many writes have lowered or may
// have lowered it: a scan raises the bound only if no write came in while it
// ran (the scan may not have seen that write's entry).
type floor struct {
	at     int64
	writes uint64
}

// lowerFloors lowers the floors to the entries a committed write added (in
// the index's own unit: times, or expiry buckets).
func (s *Store) lowerFloors(added map[floorKey]int64) {
	if len(added) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, at := range added {
		f := s.floors[k] // none: at 0, and a scan running may not raise it
		f.at = min(f.at, at)
		f.writes++
		s.floors[k] = f
	}
}

// resetFloors forgets every floor (after a write whose entries are not
// tracked, e.g. a Bulk): the next scans start at each index's beginning.
func (s *Store) resetFloors() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.floors)
	s.resets++ // a scan running may not raise a floor
}

// Open opens (or creates) the store in dir, with the default Options.
func Open(dir string, log *slog.Logger) (*Store, error) { return OpenWith(dir, log, Options{}) }

// OpenWith opens (or creates) the store in dir.
func OpenWith(dir string, log *slog.Logger, o Options) (*Store, error) {
	if o.ExpiryBucket == 0 {
		o.ExpiryBucket = DefaultExpiryBucket
	}
	if o.ExpiryBucket < time.Millisecond {
		return nil, fmt.Errorf("store: ExpiryBucket %s: want at least 1ms", o.ExpiryBucket)
	}
	if log == nil {
		log = slog.Default()
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 32 << 20
	}
	if o.FlushFailLimit <= 0 {
		o.FlushFailLimit = DefaultFlushFailLimit
	}
	s := &Store{dir: dir, log: log, floors: map[floorKey]floor{},
		bucketMs: o.ExpiryBucket.Milliseconds(), failed: make(chan struct{}), flushFailLimit: o.FlushFailLimit}
	pl := pebbleLogger{log.With("component", "pebble")}
	opts := &pebble.Options{
		FS:     o.FS,
		Logger: pl,
		EventListener: &pebble.EventListener{BackgroundError: s.backgroundError(pl), LowDiskSpace: s.lowDiskSpace,
			FlushEnd: s.flushEnd, CompactionEnd: s.compactionEnd},
		BytesPerSync: 1 << 20,
		MemTableSize: o.MemTableSize,
		MaxOpenFiles: 1000,
		// the point reads of a poll hit recently written states most: keep
		// their blocks decompressed in memory (Pebble's default is 8 MiB)
		CacheSize:          64 << 20,
		FormatMajorVersion: pebble.FormatNewest,
		DisableWAL:         true,
	}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	opts.EnsureDefaults()
	if err := dropUnsynced(dir, log); err != nil {
		return nil, err
	}
	// the files of a Bulk that did not commit (a crash in the middle)
	if tmp, err := filepath.Glob(filepath.Join(dir, "bulk-*.sst.tmp")); err == nil {
		for _, f := range tmp {
			_ = os.Remove(f)
		}
	}
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, s.check(fmt.Errorf("store: open %s: %w", dir, err))
	}
	s.db, s.opts, s.codec = db, opts, c
	if err := s.upgrade(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// layoutVersion is the version of the key layout; a store of another
// version is emptied on open (it is a cache: the changelog restores it).
// An expiry bucket other than the default is part of it.
const layoutVersion = "4"

// layout is the store's key layout: its version and expiry bucket width.
func (s *Store) layout() string {
	if s.bucketMs == DefaultExpiryBucket.Milliseconds() {
		return layoutVersion
	}
	return layoutVersion + "/x=" + strconv.FormatInt(s.bucketMs, 10) + "ms"
}

func (s *Store) upgrade() error {
	layoutVersion := s.layout()
	v, closer, err := s.db.Get([]byte("v"))
	found := ""
	if err == nil {
		found = string(v)
		closer.Close()
		if found == layoutVersion {
			return nil
		}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("store: layout version: %w", err)
	}
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("store: layout version: %w", err)
	}
	empty := !it.First()
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: layout version: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	// a new store gets no range delete: the sstables of a restore would
	// overlap it, and land above it for Pebble to compact
	if !empty {
		s.log.Info("the state directory holds another key layout; emptying it: it is restored from the changelog",
			"dir", s.dir, "layout", found, "want", layoutVersion)
		if err := b.DeleteRange([]byte{0}, []byte{0xff}, nil); err != nil {
			return err
		}
	}
	if err := b.Set([]byte("v"), []byte(layoutVersion), nil); err != nil {
		return err
	}
	// on disk with the first memtable flushed (there is no WAL): a store
	// left before that, and holding tables, is emptied on open and restored
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("store: set layout version: %w", err)
	}
	return nil
}

// WipePartition deletes everything the store holds of partition p: its
// tasks, their index entries, its checkpoint and its release mark. The next
// restore of p reads the changelog from its start. It reports whether the
// store held any task of p.
func (s *Store) WipePartition(p int32) (bool, error) {
	b := s.db.NewBatch()
	defer b.Close()
	had := false
	for _, prefix := range []byte{'t', 'd', 'x', 'o'} {
		lo := binary.BigEndian.AppendUint32([]byte{prefix, '/'}, uint32(p))
		hi := binary.BigEndian.AppendUint32([]byte{prefix, '/'}, uint32(p+1))
		// a range holding nothing gets no range delete: a restore's
		// sstables of the partition would overlap it, and land above it
		// for Pebble to compact, instead of in the last level
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return false, fmt.Errorf("store: wipe partition %d: %w", p, err)
		}
		found := it.First()
		if err := it.Close(); err != nil {
			return false, fmt.Errorf("store: wipe partition %d: %w", p, err)
		}
		if !found {
			continue
		}
		had = had || prefix == 't'
		if err := b.DeleteRange(lo, hi, nil); err != nil {
			return false, err
		}
	}
	for _, k := range [][]byte{checkpointKey(p), releasedKey(p)} {
		_, closer, err := s.db.Get(k)
		if errors.Is(err, pebble.ErrNotFound) {
			continue // nor a delete that a restore's sstables would overlap
		}
		if err != nil {
			return false, fmt.Errorf("store: wipe partition %d: %w", p, err)
		}
		closer.Close()
		_ = b.Delete(k, nil)
	}
	if b.Empty() {
		return false, nil
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return false, fmt.Errorf("store: wipe partition %d: %w", p, err)
	}
	return had, nil
}

// A Release is a partition's release mark: the changelog's committed end
// offset when this instance let the partition go, when it did, by this
// machine's clock, and the partition's checkpoint then (Checkpoint; -1 for
// none). A mark written by a release before marks had the time and the
// checkpoint has only End (At zero).
//
// The checkpoint tells whether the store's state of the partition is still
// the one the mark was written after: a process that took the partition
// back and was then killed may leave the mark (its deletion still in the
// memtable) over state it wrote since (a restore's ingested sstables), and
// every such write moves the checkpoint.
type Release struct {
	End        int64
	At         time.Time
	Checkpoint int64
}

// SetReleased records the release mark of partition p as this instance
// releases the partition (revoked, with everything it committed applied).
func (s *Store) SetReleased(p int32, r Release) error {
	v := binary.BigEndian.AppendUint64(nil, uint64(r.End))
	v = binary.BigEndian.AppendUint64(v, uint64(r.At.UnixMilli()))
	v = binary.BigEndian.AppendUint64(v, uint64(r.Checkpoint))
	if err := s.db.Set(releasedKey(p), v, pebble.NoSync); err != nil {
		return fmt.Errorf("store: release mark of partition %d: %w", p, err)
	}
	return nil
}

// TakeReleased returns and deletes the release mark of partition p, and
// false when there is none (never released cleanly, or already taken).
func (s *Store) TakeReleased(p int32) (Release, bool, error) {
	v, closer, err := s.db.Get(releasedKey(p))
	if errors.Is(err, pebble.ErrNotFound) {
		return Release{}, false, nil
	}
	if err != nil {
		return Release{}, false, fmt.Errorf("store: release mark of partition %d: %w", p, err)
	}
	r := Release{Checkpoint: -1}
	ok := len(v) == 8 || len(v) == 24
	if ok {
		r.End = int64(binary.BigEndian.Uint64(v))
	}
	if len(v) == 24 {
		r.At = time.UnixMilli(int64(binary.BigEndian.Uint64(v[8:])))
		r.Checkpoint = int64(binary.BigEndian.Uint64(v[16:]))
	}
	closer.Close()
	if err := s.db.Delete(releasedKey(p), pebble.NoSync); err != nil {
		return Release{}, false, fmt.Errorf("store: release mark of partition %d: %w", p, err)
	}
	return r, ok, nil
}

// Close flushes the memtables (there is no WAL) and closes the store; what
// a process killed before it loses is restored from the changelog.
func (s *Store) Close() error {
	if err := s.Err(); err != nil {
		// a flush would wait for as long as the disk stays full, and so
		// may a write that was under way; what the memtables held is in
		// the changelog
		closed := make(chan error, 1)
		go func() { closed <- s.db.Close() }()
		select {
		case cerr := <-closed:
			return errors.Join(err, cerr)
		case <-time.After(failedCloseWait):
			return errors.Join(err, errors.New("store: close: a write is waiting for the disk; left open"))
		}
	}
	s.syncs.Wait() // a clean close leaves no unsynced mark
	// without a WAL, the memtables are the only copy of the latest writes
	if err := s.db.Flush(); err != nil {
		s.db.Close()
		return fmt.Errorf("store: flush on close: %w", err)
	}
	return s.db.Close()
}

// Get returns the state of task taskID of partition p, or nil when the
// store has none.
func (s *Store) Get(p int32, taskID string) (*task.State, error) {
	v, closer, err := s.db.Get(taskKey(p, taskID))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: get %s: %w", taskID, err)
	}
	defer closer.Close()
	st, err := s.codec.DecodeState(v) // an Avro TaskState, or the JSON of an earlier build
	if err != nil {
		return nil, fmt.Errorf("store: decode state of %s: %w", taskID, err)
	}
	return st, nil
}

// EntriesOf returns the index entries of the stored state of task taskID
// of partition p, and false when the store has none: Get for a caller that
// needs only what a write of the task's next state replaces (the state is
// validated, not built).
func (s *Store) EntriesOf(p int32, taskID []byte) (Entries, bool, error) {
	v, closer, err := s.db.Get(appendTaskKey(make([]byte, 0, taskKeyLen+len(taskID)), p, taskID))
	if errors.Is(err, pebble.ErrNotFound) {
		return Entries{}, false, nil
	}
	if err != nil {
		return Entries{}, false, fmt.Errorf("store: get %s: %w", taskID, err)
	}
	defer closer.Close()
	x, err := s.IndexEntries(v)
	if err != nil {
		return Entries{}, false, fmt.Errorf("store: decode state of %s: %w", taskID, err)
	}
	return x, true, nil
}

// IndexEntries reads the index entries of an encoded state (an Avro
// TaskState, or the JSON of an earlier build), validating the whole record
// without building it (codec.DecodeStateIndex).
func (s *Store) IndexEntries(v []byte) (Entries, error) {
	var x codec.StateIndex
	if err := s.codec.DecodeStateIndex(v, &x); err != nil {
		return Entries{}, err
	}
	return EntriesOfIndex(&x), nil
}

// Load reads the states of many tasks at once into out, each of the
// partition partOf gives; tasks the store does not know are left out, and
// tasks out already holds are not read. The
// keys are read in sorted order with one iterator: each lookup is a prefix
// seek, which consults the bloom filters like a Get and, moving forward only,
// continues from where the previous one stopped instead of searching every
// level again.
func (s *Store) Load(ids []string, partOf func(id string) int32, out map[string]*task.State) error {
	keys := make([][]byte, 0, len(ids))
	n := 0
	for _, id := range ids {
		n += taskKeyLen + len(id)
	}
	buf := make([]byte, 0, n) // every key in one allocation
	for _, id := range ids {
		if _, ok := out[id]; !ok {
			buf = appendTaskKey(buf, partOf(id), id)
			keys = append(keys, buf[len(buf)-taskKeyLen-len(id):len(buf):len(buf)])
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.SortFunc(keys, bytes.Compare)
	keys = slices.CompactFunc(keys, bytes.Equal)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: keys[0], UpperBound: append(slices.Clip(keys[len(keys)-1]), 0)})
	if err != nil {
		return fmt.Errorf("store: load: %w", err)
	}
	if err := s.load(it, keys, out); err != nil {
		it.Close()
		return err
	}
	return it.Close()
}

func (s *Store) load(it *pebble.Iterator, keys [][]byte, out map[string]*task.State) error {
	for _, k := range keys {
		id := k[taskKeyLen:]
		if !it.SeekPrefixGE(k) || !bytes.Equal(it.Key(), k) {
			if err := it.Error(); err != nil {
				return fmt.Errorf("store: get %s: %w", id, err)
			}
			continue
		}
		v, err := it.ValueAndErr() // valid until the next seek: DecodeState copies what it keeps
		if err != nil {
			return fmt.Errorf("store: get %s: %w", id, err)
		}
		st, err := s.codec.DecodeState(v) // an Avro TaskState, or the JSON of an earlier build
		if err != nil {
			return fmt.Errorf("store: decode state of %s: %w", id, err)
		}
		out[string(id)] = st
	}
	return nil
}

// failedCloseWait bounds how long Close of a failed store waits for Pebble.
const failedCloseWait = 5 * time.Second

// ErrUnwritable is the store's failure (Err): its directory can no longer
// be written.
var ErrUnwritable = errors.New("store: the state directory cannot be written")

// Failed is closed once the store can no longer be written; Err says why.
func (s *Store) Failed() <-chan struct{} { return s.failed }

// Err returns the store's failure, an ErrUnwritable, or nil. A store fails
// on the first write, flush or compaction that finds its disk full
// (ENOSPC), its quota reached (EDQUOT) or its file system read-only
// (EROFS): none of them passes on its own soon, and Pebble would retry the
// flush until it does while every write waits. It fails too once its
// flushes, or its compactions, have failed for Options.FlushFailLimit,
// none done in between, whatever the error (EIO from a failing disk, a
// volume gone). Other errors are returned by the operation that met them,
// and leave the store as it was.
func (s *Store) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

// BackgroundErrors returns how many of Pebble's flushes and compactions
// have failed since the store was opened.
func (s *Store) BackgroundErrors() int64 { return s.bgErrors.Load() }

// unwritable reports whether err says the state directory cannot be
// written until someone frees space or remounts it.
func unwritable(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS)
}

// check makes err the store's failure if it is one (unwritable), and
// returns err.
func (s *Store) check(err error) error {
	if err == nil || !unwritable(err) {
		return err
	}
	s.fail(err, "state store failed: free space on its volume, or give it a larger one; the changelog holds every state, and a restart restores the store from it")
	return err
}

// fail makes err the store's failure, once, and logs msg with it.
func (s *Store) fail(err error, msg string) {
	s.failOnce.Do(func() {
		s.failErr = fmt.Errorf("%w: %s: %w", ErrUnwritable, s.dir, err)
		close(s.failed)
		s.log.Error(msg, "dir", s.dir, "err", err.Error())
	})
}

// flushEnd is Pebble's FlushEnd listener: it fails the store once its
// flushes have failed for flushFailLimit with none done in between
// (Options.FlushFailLimit). A flush that had nothing to write is done.
func (s *Store) flushEnd(info pebble.FlushInfo) {
	done := info.Err == nil || (len(info.Output) == 0 && info.Err.Error() == emptyFlush)
	s.failing(&s.flushFailing, done, "flushes", info.Err)
}

// compactionEnd is Pebble's CompactionEnd listener: it fails the store
// once its compactions have failed for flushFailLimit with none done in
// between. Pebble picks a failed compaction of L0 again at once, as it
// retries a flush; one whose tables below L0 failed is kept out of
// compactions for 30 s, and meanwhile Pebble compacts L0 into a level
// without them where it can. A compaction it cancelled (another took its tables, the
// store is closing) neither failed nor was done.
func (s *Store) compactionEnd(info pebble.CompactionInfo) {
	if errors.Is(info.Err, pebble.ErrCancelledCompaction) {
		return
	}
	s.failing(&s.compactFailing, info.Err == nil, "compactions", info.Err)
}

// failing keeps since, when the flushes or compactions (what) began to
// fail, up to date with one that ended (done, or failed with err), and
// fails the store once they have failed for flushFailLimit.
func (s *Store) failing(since *atomic.Int64, done bool, what string, err error) {
	if done {
		since.Store(0)
		return
	}
	now := time.Now().UnixNano()
	if since.CompareAndSwap(0, now) {
		return
	}
	if d := time.Duration(now - since.Load()); d >= s.flushFailLimit {
		s.fail(fmt.Errorf("%s failing for %s: %w", what, d.Round(time.Second), err),
			"state store failed: its "+what+" keep failing; check its volume; the changelog holds every state, and a restart restores the store from it")
	}
}

// emptyFlush is the error Pebble's FlushEnd reports for a flush that wrote
// no table (nothing to write): not a failure.
const emptyFlush = "pebble: empty table"

// backgroundError is Pebble's BackgroundError listener: a failure of a
// flush or compaction is logged, and fails the store if it is one
// (check). Pebble retries a failed flush at once, thousands of times a
// second: at most one a second is logged at error level, with the count
// so far, the rest at debug level, and all of them once the store failed.
func (s *Store) backgroundError(log pebbleLogger) func(error) {
	return func(err error) {
		n := s.bgErrors.Add(1)
		if s.Err() != nil || !s.logNow() {
			log.log.Debug("background error", "err", err.Error())
		} else {
			log.log.Error("background error", "err", err.Error(), "background_errors", n)
		}
		s.check(err)
	}
}

// logNow reports whether a background error may be logged at error level
// now: one a second at most.
func (s *Store) logNow() bool {
	now := time.Now().UnixNano()
	last := s.bgLogged.Load()
	return (last == 0 || now-last >= int64(time.Second)) && s.bgLogged.CompareAndSwap(last, now)
}

// lowDiskSpace is Pebble's LowDiskSpace listener: it warns when the space
// left on the store's volume falls under 10%, 5%, 3%, 2% and 1% (and again
// every 30 minutes while it stays under), before a full volume stops the
// router (Err).
func (s *Store) lowDiskSpace(info pebble.LowDiskSpaceInfo) {
	s.log.Warn("state store's volume is running out of space; once it is full the router stops",
		"dir", s.dir, "available_bytes", info.AvailBytes, "total_bytes", info.TotalBytes, "under_percent", info.PercentThreshold)
}

// ErrCorruptCheckpoint is returned by Checkpoint when the stored checkpoint
// of a partition is not an 8-byte offset. The store is a cache of the
// changelog: the caller restores that partition from the changelog's start.
var ErrCorruptCheckpoint = errors.New("store: corrupt changelog checkpoint")

// Checkpoint returns the next changelog offset to restore partition p from,
// and false when the store has never seen the partition. A checkpoint that
// does not decode is ErrCorruptCheckpoint.
func (s *Store) Checkpoint(p int32) (int64, bool, error) {
	v, closer, err := s.db.Get(checkpointKey(p))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("store: checkpoint of partition %d: %w", p, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, fmt.Errorf("%w: partition %d: %d bytes, want 8", ErrCorruptCheckpoint, p, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), true, nil
}

// Index names one of the per-partition time indexes.
type Index byte

// The time indexes: pending retries by due time, expiring states by hour
// bucket, open review items by their owner's SLA deadline.
const (
	DueIndex     Index = 'd'
	ExpiryIndex  Index = 'x'
	OverdueIndex Index = 'o'
)

// Scan returns up to limit entries of index ix of partition p that have come
// due at nowMs, earliest first: Due, Expired or Overdue.
func (s *Store) Scan(ix Index, p int32, nowMs int64, limit int) ([]Due, error) {
	if ix == ExpiryIndex {
		return s.Expired(p, nowMs, limit)
	}
	return s.scanTimes(byte(ix), p, nowMs, limit)
}

// DropStale deletes entries of index ix of partition p that no longer match
// their task's state. The indexes are derived from the states, so this
// repairs the cache without a changelog record.
func (s *Store) DropStale(ix Index, p int32, stale []Due) error {
	return s.dropTimes(byte(ix), p, stale)
}

// Due is one entry of the due index: a task whose pending retry is due.
type Due struct {
	TaskID    string
	NotBefore int64
	// DueAt is, in the due index only, the retry's own due time
	// (task.PendingRetry.Due): it orders entries with the same NotBefore.
	DueAt int64
}

// Due returns up to limit entries of partition p's due index with a due time
// at or before nowMs, earliest first.
func (s *Store) Due(p int32, nowMs int64, limit int) ([]Due, error) {
	return s.scanTimes('d', p, nowMs, limit)
}

// Overdue returns up to limit open review items of partition p whose owner's
// SLA deadline is at or before nowMs, earliest first (NotBefore holds the
// deadline).
func (s *Store) Overdue(p int32, nowMs int64, limit int) ([]Due, error) {
	return s.scanTimes('o', p, nowMs, limit)
}

func (s *Store) scanTimes(prefix byte, p int32, nowMs int64, limit int) ([]Due, error) {
	fk := floorKey{prefix, p}
	s.mu.Lock()
	f, resets := s.floors[fk], s.resets
	s.mu.Unlock()
	from := min(f.at, nowMs+1)
	lo := timeKey(prefix, p, from, "")
	hi := timeKey(prefix, p, nowMs+1, "")
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, fmt.Errorf("store: %c/ index: %w", prefix, err)
	}
	defer it.Close()
	var out []Due
	defer func() {
		if it.Error() != nil {
			return
		}
		// every entry before the first found (or, none found, up to now) is
		// deleted: the next scan starts there
		next := nowMs + 1
		if len(out) > 0 {
			next = out[0].NotBefore
		}
		s.mu.Lock()
		if g := s.floors[fk]; g.writes == f.writes && s.resets == resets && next > g.at {
			s.floors[fk] = floor{at: next, writes: g.writes}
		}
		s.mu.Unlock()
	}()
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		d := Due{NotBefore: int64(binary.BigEndian.Uint64(k[len(lo)-8 : len(lo)]))}
		if prefix == 'd' {
			d.DueAt = int64(binary.BigEndian.Uint64(k[len(lo) : len(lo)+8]))
			d.TaskID = string(k[len(lo)+8:])
		} else {
			d.TaskID = string(k[len(lo):])
		}
		out = append(out, d)
	}
	return out, it.Error()
}

// DropDue deletes due-index entries of partition p that no longer match
// their task's pending retry. The indexes are derived from the states, so
// this repairs the cache without a changelog record.
func (s *Store) DropDue(p int32, stale []Due) error { return s.dropTimes('d', p, stale) }

// DropOverdue deletes overdue-review entries of partition p that no longer
// match their task's open review item.
func (s *Store) DropOverdue(p int32, stale []Due) error { return s.dropTimes('o', p, stale) }

func (s *Store) dropTimes(prefix byte, p int32, stale []Due) error {
	if len(stale) == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, d := range stale {
		k := timeKey(prefix, p, d.NotBefore, d.TaskID)
		if prefix == 'd' {
			k = dueKey(p, d.NotBefore, d.DueAt, d.TaskID)
		}
		if err := b.Delete(k, nil); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("store: drop stale %c/ entries: %w", prefix, err)
	}
	return nil
}

// Expired returns up to limit entries of partition p's expiry index whose
// hour bucket lies wholly before nowMs (NotBefore holds the bucket). Only the
// expired buckets of the partition are read, never the whole store.
func (s *Store) Expired(p int32, nowMs int64, limit int) ([]Due, error) {
	return s.scanTimes('x', p, nowMs/s.bucketMs-1, limit)
}

// DropExpired deletes expiry-index entries of partition p that no longer
// match their task's state (the task was deleted or its expiry moved).
func (s *Store) DropExpired(p int32, stale []Due) error { return s.dropTimes('x', p, stale) }

// Metrics returns Pebble's metrics (disk usage, memtable size, ...).
func (s *Store) Metrics() *pebble.Metrics { return s.db.Metrics() }

// PebbleLogger routes Pebble's log lines to log: its info lines at debug
// level. The console's own Pebble view logs through it too.
func PebbleLogger(log *slog.Logger) pebble.Logger { return pebbleLogger{log} }

type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
	panic(fmt.Sprintf(format, args...))
}
