package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards the clean shutdown's last batch: a router whose context ends (a
// SIGTERM in a deploy) while a batch is between its poll and its commit
// commits that batch before it leaves. The batch's audit record is
// committed and the group's offset moves past its input before any other
// instance runs; aborted, the input would wait for the partition's next
// owner and be routed again by it.
func TestShutdownCommitsTheBatchInFlight(t *testing.T) {
	w := lcStart(t, 1)
	cfg := w.config("drain")
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// the SIGTERM comes while the batch of task t-last is being committed
	var once sync.Once
	beforeCommit = func(b *batch) {
		for i := range b.inputs {
			if string(b.inputs[i].Rec.Key) == "t-last" {
				once.Do(stop)
			}
		}
	}
	t.Cleanup(func() { beforeCommit = nil })
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	if !w.routes("t-first") {
		t.Fatal("the router never routed t-first")
	}
	w.produce(okEvent("t-last"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its context's end")
	}
	if ctx.Err() == nil {
		t.Fatal("the router stopped before the batch of t-last reached its commit")
	}
	if got := w.committed(w.topics.Audit, "t-last", time.Second); len(got) != 1 {
		t.Fatalf("after the shutdown, %d committed audit records of t-last, want 1: the batch in flight was not committed", len(got))
	}
	adm, err := kgo.NewClient(w.seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offsets, err := kadm.NewClient(adm).FetchOffsets(context.Background(), cfg.Group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offsets.Lookup(w.topics.Ingress, 0); !ok || o.At != 2 {
		t.Fatalf("the group's committed offset of the ingress partition is %+v, want 2 (past t-first and t-last)", o)
	}
}
