package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceTxn produces recs in one transaction of txn and ends it with end.
func produceTxn(ctx context.Context, t *testing.T, txn *kgo.Client, end kgo.TransactionEndTry, recs ...*kgo.Record) {
	t.Helper()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := txn.EndTransaction(ctx, end); err != nil {
		t.Fatal(err)
	}
}

// Guards tail --until-end: it prints exactly the records committed when it
// started (committed transactions and plain records, not aborted ones, not
// control records), skips empty partitions, and exits on its own.
func TestTailUntilEnd(t *testing.T) {
	const topic = "tail.t"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("tail-test"), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	produceTxn(ctx, t, txn, kgo.TryCommit, &kgo.Record{Partition: 0, Value: []byte("committed-1")}, &kgo.Record{Partition: 0, Value: []byte("committed-2")})
	produceTxn(ctx, t, txn, kgo.TryAbort, &kgo.Record{Partition: 0, Value: []byte("aborted")})
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("plain")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var out, errOut bytes.Buffer
	args := []string{"--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", topic, "--from-beginning", "--until-end", "--format", "json"}
	if err := tailCommand(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("tail: %v (%s)", err, errOut.String())
	}
	if ctx.Err() != nil {
		t.Fatal("tail --until-end did not exit on its own")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("tail printed %d lines, want 3 (two committed, one plain):\n%s", len(lines), out.String())
	}
	if strings.Contains(out.String(), "YWJvcnRlZA") { // base64 of "aborted"
		t.Errorf("tail printed an aborted record:\n%s", out.String())
	}

	out.Reset()
	if err := tailCommand(ctx, []string{"--topic", topic, "--until-end", "--until-idle", "1s"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--until-end and --until-idle") {
		t.Errorf("both --until-end and --until-idle: %v, want an error naming both", err)
	}
}

// Guards replay's end condition on a transactional topic: it stops at the
// end offsets, recognising the commit marker that ends the range, instead of
// waiting out --idle (set to an hour here, past the test's deadline), and
// prints the committed records, not the aborted one.
func TestReplayEndsAtCommitMarker(t *testing.T) {
	const topic = "ai.tasks.audit"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("replay-test"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	for _, end := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		produceTxn(ctx, t, txn, end, &kgo.Record{Key: []byte("t-1"), Value: []byte("undecodable")})
	}
	var out, errOut bytes.Buffer
	args := []string{"--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", "audit", "--format", "json", "--idle", "1h"}
	if err := replayCommand(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("replay waited for --idle instead of stopping at the end offsets:\n%s", errOut.String())
	}
	if n := strings.Count(out.String(), "\n"); n != 2 || !strings.Contains(errOut.String(), "replay: 2 records read") {
		t.Errorf("replay printed %d records, want the 2 committed ones:\n%s\n%s", n, out.String(), errOut.String())
	}
}
