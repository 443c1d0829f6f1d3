package scan

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const topic = "scan.t"

// cluster is a kfake cluster with topic on three partitions and, written in
// this order: on partition 0 a committed transaction (c1, c2), an aborted
// one (x1) and a committed one (c3), so that the partition ends in a commit
// marker; on partition 1 two plain records (p1, p2); partition 2 empty.
func cluster(t *testing.T) (seeds []kgo.Opt, txn *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds = []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	txn, err = kgo.NewClient(append(seeds, kgo.TransactionalID("scan-test"), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(txn.Close)
	ctx := context.Background()
	produceTxn(t, txn, kgo.TryCommit, "c1", "c2")
	produceTxn(t, txn, kgo.TryAbort, "x1")
	produceTxn(t, txn, kgo.TryCommit, "c3")
	plain, err := kgo.NewClient(append(seeds, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("p1")}, &kgo.Record{Partition: 1, Value: []byte("p2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return seeds, txn
}

// produceTxn produces values to partition 0 in one transaction ended by end.
func produceTxn(t *testing.T, txn *kgo.Client, end kgo.TransactionEndTry, values ...string) {
	t.Helper()
	ctx := context.Background()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := txn.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := txn.EndTransaction(ctx, end); err != nil {
		t.Fatal(err)
	}
}

func committed(t *testing.T, seeds []kgo.Opt) Ranges {
	t.Helper()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rs, err := Committed(context.Background(), kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// result is everything one Read delivered.
type result struct {
	values  []string // "partition:value"
	markers int
	next    map[int32]int64
	lastB   *Batch
}

func read(t *testing.T, seeds []kgo.Opt, rs Ranges, opts ...Opt) (result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := result{next: map[int32]int64{}}
	err := Read(ctx, seeds, rs, func(b *Batch) error {
		for _, r := range b.Records {
			if r.Attrs.IsControl() {
				t.Errorf("a marker among the records: %d@%d", r.Partition, r.Offset)
			}
			res.values = append(res.values, string(rune('0'+r.Partition))+":"+string(r.Value))
		}
		res.markers += len(b.Markers)
		for p, n := range b.Next[topic] {
			res.next[p] = n
		}
		res.lastB = b
		return nil
	}, opts...)
	return res, err
}

// Guards the reader's contract: it delivers exactly the records committed
// when the scan was planned (committed transactions and plain records, never
// an aborted one, never a marker among the data), stops on its own at the
// end, which on partition 0 is a commit marker that no data record reaches,
// skips the empty partition, and reports where each partition ends.
func TestReadToCommittedEnd(t *testing.T) {
	seeds, _ := cluster(t)
	rs := committed(t, seeds)
	if got := rs[topic][2]; got.End != got.Start {
		t.Fatalf("empty partition 2 has range %+v, want an empty one", got)
	}
	res, err := read(t, seeds, rs)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	slices.Sort(res.values)
	want := []string{"0:c1", "0:c2", "0:c3", "1:p1", "1:p2"}
	if !slices.Equal(res.values, want) {
		t.Errorf("delivered %v, want %v", res.values, want)
	}
	if res.markers != 3 { // two commits and one abort below the end
		t.Errorf("%d markers, want 3", res.markers)
	}
	for p := int32(0); p < 2; p++ {
		if res.next[p] != rs[topic][p].End {
			t.Errorf("partition %d: next %d, want its end %d", p, res.next[p], rs[topic][p].End)
		}
	}
	if res.lastB.Left != 0 || res.lastB.Partitions != 0 {
		t.Errorf("last batch: %d offsets left in %d partitions, want none", res.lastB.Left, res.lastB.Partitions)
	}
}

// Guards the fixed end (a record committed after the scan was planned is
// not delivered), ranges that start inside a partition, the uncommitted mode
// (aborted records delivered, for checks that count them) and Stop.
func TestReadOptions(t *testing.T) {
	seeds, txn := cluster(t)
	all := committed(t, seeds)
	produceTxn(t, txn, kgo.TryCommit, "late")

	t.Run("late", func(t *testing.T) {
		res, err := read(t, seeds, all)
		slices.Sort(res.values)
		if err != nil || !slices.Equal(res.values, []string{"0:c1", "0:c2", "0:c3", "1:p1", "1:p2"}) {
			t.Errorf("%v, %v; want what was committed when the scan was planned", res.values, err)
		}
	})

	t.Run("start", func(t *testing.T) {
		rs := Ranges{}
		rs.Set(topic, 1, Range{Start: 1, End: all[topic][1].End})
		res, err := read(t, seeds, rs)
		if err != nil || !slices.Equal(res.values, []string{"1:p2"}) {
			t.Errorf("from offset 1 of partition 1: %v, %v; want [1:p2]", res.values, err)
		}
	})
	t.Run("uncommitted", func(t *testing.T) {
		rs := Ranges{}
		rs.Set(topic, 0, all[topic][0])
		res, err := read(t, seeds, rs, Uncommitted())
		if err != nil || !slices.Equal(res.values, []string{"0:c1", "0:c2", "0:x1", "0:c3"}) {
			t.Errorf("uncommitted: %v, %v; want the aborted x1 too", res.values, err)
		}
	})
	t.Run("stop", func(t *testing.T) {
		calls := 0
		err := Read(context.Background(), seeds, all, func(*Batch) error { calls++; return Stop })
		if err != nil || calls != 1 {
			t.Errorf("Stop: err %v after %d calls, want nil after 1", err, calls)
		}
	})
	t.Run("error", func(t *testing.T) {
		boom := errors.New("boom")
		if err := Read(context.Background(), seeds, all, func(*Batch) error { return boom }); !errors.Is(err, boom) {
			t.Errorf("err %v, want the callback's", err)
		}
	})
}

// Guards the stall guard: a range whose end nothing will ever reach ends in
// ErrStalled naming the partition once nothing was delivered for Idle,
// after delivering what there was.
func TestReadStalled(t *testing.T) {
	seeds, _ := cluster(t)
	rs := Ranges{}
	rs.Set(topic, 1, Range{Start: 0, End: 100})
	res, err := read(t, seeds, rs, Idle(500*time.Millisecond))
	if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), topic+"/1") {
		t.Fatalf("err %v, want ErrStalled naming %s/1", err, topic)
	}
	if !slices.Equal(res.values, []string{"1:p1", "1:p2"}) {
		t.Errorf("delivered %v before stalling, want [1:p1 1:p2]", res.values)
	}
	if res.lastB.Left != 98 || res.lastB.Partitions != 1 {
		t.Errorf("left %d in %d partitions, want 98 in 1", res.lastB.Left, res.lastB.Partitions)
	}
}
