package txn

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// outBatch is a Batch of fixed records.
type outBatch struct{ recs []*kgo.Record }

func (b *outBatch) Out() []*kgo.Record      { return b.recs }
func (b *outBatch) Checkpoint(int32, int64) {}

// Guards the end of a transaction that owns and consumed nothing
// (EndAlone): on the client, without the group session, it commits what it
// produced, readable by a read_committed consumer, or aborts it, and says
// which; the session is usable for the next transaction.
func TestEndAloneCommitsOrAborts(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "alerts", "ingress"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	seeds := kgo.SeedBrokers(cluster.ListenAddrs()...)
	sess, err := kgo.NewGroupTransactSession(seeds, kgo.TransactionalID("txn-alone"), kgo.ConsumerGroup("g"),
		kgo.ConsumeTopics("ingress"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end := func(value string, try kgo.TransactionEndTry) bool {
		t.Helper()
		tx := New(sess, &outBatch{recs: []*kgo.Record{{Topic: "alerts", Value: []byte(value)}}}, "state")
		if err := tx.Begin(); err != nil {
			t.Fatal(err)
		}
		tx.Produce(ctx)
		if err := tx.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		ok, err := tx.EndAlone(ctx, try)
		if err != nil {
			t.Fatalf("%s: %v", value, err)
		}
		return ok
	}
	if !end("kept", kgo.TryCommit) {
		t.Error("a commit reported not committed")
	}
	if end("dropped", kgo.TryAbort) {
		t.Error("an abort reported committed")
	}
	if !end("kept too", kgo.TryCommit) {
		t.Error("the commit after an abort reported not committed")
	}

	reader, err := kgo.NewClient(seeds, kgo.ConsumeTopics("alerts"), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var got []string
	for len(got) < 2 && ctx.Err() == nil {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != 2 || got[0] != "kept" || got[1] != "kept too" {
		t.Errorf("read_committed reads %q, want [kept kept too]", got)
	}
	// nothing after them: the aborted record stays invisible
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	reader.PollFetches(short).EachRecord(func(r *kgo.Record) { t.Errorf("read %q after the committed records", r.Value) })
}
