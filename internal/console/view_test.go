package console

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards the view's batch reads: a key deleted earlier in the same batch is
// gone to a later read of that batch, not read back from the database (a due
// retry removed and then looked up again in one poll must stay removed).
func TestBatchReadsItsOwnDelete(t *testing.T) {
	v, err := openView(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer v.close()
	b := v.batch()
	if err := b.put("due/t-1", pendingRetry{TaskID: "t-1"}); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	b = v.batch()
	if err := b.del("due/t-1"); err != nil {
		t.Fatal(err)
	}
	var p pendingRetry
	if ok, err := b.get("due/t-1", &p); err != nil || ok {
		t.Errorf("read after a delete in the same batch: found %v (%+v), err %v; want not found", ok, p, err)
	}
	// and a key put in the batch reads back before the commit
	if err := b.put("due/t-2", pendingRetry{TaskID: "t-2"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.get("due/t-2", &p); err != nil || !ok || p.TaskID != "t-2" {
		t.Errorf("read of a put in the same batch: found %v (%+v), err %v", ok, p, err)
	}
}

// Guards the start-up progress against a data race (run with -race): the
// pages read the progress while the reader of the topics sets how far it is
// behind. A page is read in a loop from another goroutine while the console
// starts and reads the topics.
func TestProgressIsReadSafelyWhileTheViewStarts(t *testing.T) {
	for i := 0; i < 3; i++ {
		cfg := Config{Users: testUsers(t)}
		opts, set := testCluster(t)
		cfg.Listen, cfg.StateDir, cfg.Kafka, cfg.Topics = "127.0.0.1:0", t.TempDir(), opts, set
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ensureConsoleTopic(ctx, kadm.NewClient(cl)); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, caughtUp, _ := s.prog.snapshot(); caughtUp {
					return
				}
			}
		}()
		ierr := make(chan error, 1)
		go func() { ierr <- s.ingest(ctx) }()
		<-done
		cancel()
		if err := <-ierr; err != nil {
			t.Fatal(err)
		}
		close(stop)
		s.view.close()
	}
}
