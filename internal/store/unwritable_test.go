package store

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
)

// A flush that finds the disk full fails the store at once, with an error
// that names its directory and the cause, instead of leaving Pebble to
// retry it while every write waits; and Close does not wait for the disk.
func TestAFullDiskFailsTheStore(t *testing.T) {
	var full atomic.Bool
	dir := t.TempDir()
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && strings.HasSuffix(op.Path, ".sst") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return &pathErr{path: op.Path}
		}
		return nil
	}))
	s, err := OpenWith(dir, nil, Options{FS: fs, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	put := func(from, n int) error {
		wb := s.NewBatch()
		for i := from; i < from+n; i++ {
			st := benchState(i, now)
			if err := wb.Put(3, nil, st, now+2*st.SLAMs); err != nil {
				t.Fatal(err)
			}
		}
		return wb.Commit()
	}
	if err := put(0, 100); err != nil { // written and flushed while there is room
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if s.Err() != nil {
		t.Fatalf("the store failed with room on its disk: %v", s.Err())
	}

	full.Store(true)
	// more than a memtable: its flush meets the full disk
	for i := 0; s.Err() == nil && i < 200; i++ {
		if err := put(1000+i*100, 100); err != nil && s.Err() == nil {
			t.Fatalf("a write failed without failing the store: %v", err)
		}
	}
	select {
	case <-s.Failed():
	case <-time.After(30 * time.Second):
		t.Fatalf("the store did not fail on a full disk (%d background errors)", s.BackgroundErrors())
	}
	err = s.Err()
	if !errors.Is(err, ErrUnwritable) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Err() = %v: want ErrUnwritable, ENOSPC and the directory", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if !errors.Is(err, ErrUnwritable) {
			t.Fatalf("Close() = %v: want the store's failure", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the full disk")
	}

	// room again: the store opens on what it had, and is written
	full.Store(false)
	s, err = OpenWith(dir, nil, Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, err := s.Get(3, benchState(0, now).TaskID); err != nil || st == nil {
		t.Fatalf("a state flushed before the disk filled: %v, %v", st, err)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
}

// pathErr is the error a write to a full volume returns.
type pathErr struct{ path string }

func (e *pathErr) Error() string {
	return "write " + filepath.Base(e.path) + ": no space left on device"
}
func (e *pathErr) Unwrap() error { return syscall.ENOSPC }

// A restore into a store on a full disk (a Bulk, written as sstables and
// ingested) fails the store as a flush does: the restore is not tried
// again and again on a disk that has no room for it.
func TestARestoreOnAFullDiskFailsTheStore(t *testing.T) {
	ingestEveryBulk(t)
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.Contains(op.Path, "bulk-") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return &pathErr{path: op.Path}
		}
		return nil
	}))
	s, err := OpenWith(t.TempDir(), nil, Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	bk := s.NewBulk(100)
	for i := range 100 {
		st := benchState(i, now)
		v, err := st.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := bk.PutEncoded(3, nil, st, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := bk.Commit(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Commit() = %v: want ENOSPC", err)
	}
	if err := s.Err(); !errors.Is(err, ErrUnwritable) {
		t.Fatalf("Err() = %v after a restore met a full disk: want ErrUnwritable", err)
	}
	select {
	case <-s.Failed():
	default:
		t.Fatal("Failed() not closed")
	}
}

// almostFull is a file system whose volume has 1% of its space left.
type almostFull struct{ vfs.FS }

func (almostFull) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: 1 << 20, TotalBytes: 100 << 20, UsedBytes: 99 << 20}, nil
}

// A volume running out of space is warned of before it fills up.
func TestAVolumeRunningOutOfSpaceIsWarnedOf(t *testing.T) {
	var logs lockedbuf.Buffer
	dir := t.TempDir()
	s, err := OpenWith(dir, slog.New(slog.NewTextHandler(&logs, nil)), Options{FS: almostFull{vfs.Default}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := logs.String()
	if !strings.Contains(got, "level=WARN") || !strings.Contains(got, "running out of space") ||
		!strings.Contains(got, "under_percent=1") || !strings.Contains(got, dir) {
		t.Fatalf("no warning of the volume's 1%% left, naming the directory:\n%s", got)
	}
	if s.Err() != nil {
		t.Fatalf("a volume with room left failed the store: %v", s.Err())
	}
}

// A flush that keeps failing with an error other than a full disk (EIO: a
// failing disk) fails the store once it has failed for FlushFailLimit with
// no flush done in between: Pebble would retry it for ever while every
// write waits. The error names the directory and the cause. Pebble retries
// the flush thousands of times a second: the log gets one line a second.
func TestFlushesThatKeepFailingFailTheStore(t *testing.T) {
	// more than a memtable: its flush meets the broken disk, and the
	// writes wait once the memtables are full
	s, logs := keepFailing(t, 200, "flushes failing", func(op errorfs.Op) bool {
		return op.Kind.ReadOrWrite() == errorfs.OpIsWrite
	})
	// the flushes failed for 2 s before the store failed: a line a second
	if n := strings.Count(logs.String(), "level=ERROR msg=\"background error\""); n == 0 || n > 4 {
		t.Fatalf("%d background errors logged at error level of %d, want 1-4 (one a second):\n%.2000s", n, s.BackgroundErrors(), logs.String())
	}
}

// Compactions that keep failing (the disk returns EIO on reads of the
// tables they merge), while every flush is done, fail the store once they
// have failed for the limit with none done in between: otherwise the
// flushes stack tables in L0 until Pebble stops every write, for ever.
func TestCompactionsThatKeepFailingFailTheStore(t *testing.T) {
	// many memtables' worth: each flush is done and adds a table to L0,
	// whose compactions cannot read it
	keepFailing(t, 2000, "compactions failing", func(op errorfs.Op) bool {
		return op.Kind == errorfs.OpFileRead || op.Kind == errorfs.OpFileReadAt
	})
}

// keepFailing opens a store whose tables' operations that broken picks
// fail with EIO, writes up to batches batches of 100 states into it until
// it fails, and checks that it fails within 60 s, with an error that names
// the directory, the cause and what (flushes, compactions) kept failing,
// and that Close does not wait for the disk. It returns the store and its
// log.
func keepFailing(t *testing.T, batches int, what string, broken func(errorfs.Op) bool) (*Store, *lockedbuf.Buffer) {
	t.Helper()
	var on atomic.Bool
	dir := t.TempDir()
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if on.Load() && strings.HasSuffix(op.Path, ".sst") && broken(op) {
			return syscall.EIO
		}
		return nil
	}))
	logs := &lockedbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	s, err := OpenWith(dir, log, Options{FS: fs, MemTableSize: 1 << 20, FlushFailLimit: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	on.Store(true)
	var written atomic.Int64
	go func() {
		for i := 0; s.Err() == nil && i < batches; i++ {
			wb := s.NewBatch()
			for j := i * 100; j < i*100+100; j++ {
				st := benchState(j, now)
				if err := wb.Put(3, nil, st, now+2*st.SLAMs); err != nil {
					return
				}
			}
			if wb.Commit() != nil {
				return
			}
			written.Add(1)
		}
	}()
	select {
	case <-s.Failed():
	case <-time.After(60 * time.Second):
		t.Fatalf("the store did not fail while its %s (%d background errors, %d batches written, L0 %d tables)",
			what, s.BackgroundErrors(), written.Load(), s.db.Metrics().Levels[0].TablesCount)
	}
	err = s.Err()
	if !errors.Is(err, ErrUnwritable) || !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), what) {
		t.Fatalf("Err() = %v: want ErrUnwritable, EIO, the directory and %q", err, what)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the broken disk")
	}
	return s, logs
}

// A flush that fails once, and is done when Pebble tries it again, leaves
// the store working: a volume that stalls briefly does not stop the
// instance.
func TestAFlushThatFailsOnceDoesNotFailTheStore(t *testing.T) {
	var fails atomic.Int32
	fails.Store(1)
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".sst") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && fails.Add(-1) >= 0 {
			return syscall.EIO
		}
		return nil
	}))
	s, err := OpenWith(t.TempDir(), nil, Options{FS: fs, FlushFailLimit: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	wb := s.NewBatch()
	for i := range 100 {
		st := benchState(i, now)
		if err := wb.Put(3, nil, st, now+2*st.SLAMs); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if s.BackgroundErrors() == 0 {
		t.Fatal("the injected flush error was not met")
	}
	if s.Err() != nil || s.flushFailing.Load() != 0 {
		t.Fatalf("a flush that failed once and was then done left the store failed (%v) or failing", s.Err())
	}
	if st, err := s.Get(3, benchState(0, now).TaskID); err != nil || st == nil {
		t.Fatalf("a state flushed on the second try: %v, %v", st, err)
	}
}
