package restore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/task"
)

const rsHour = int64(3_600_000)

// rsWorld is a restore into a real Pebble store, with no Kafka: its
// applier is fed changelog records directly.
type rsWorld struct {
	t     *testing.T
	cfg   Config
	codec *codec.Codec
}

func rsStart(t *testing.T) *rsWorld {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := store.Open(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rsWorld{t: t, cfg: Config{Store: s, Log: log, Metrics: NewMetrics()}, codec: c}
}

// rsOnChangelog is a restore world whose changelog is topic "state" of
// one partition on a kfake cluster, and the cluster's seeds.
func rsOnChangelog(t *testing.T) (*rsWorld, []kgo.Opt) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "state"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	seeds := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}
	w := rsStart(t)
	w.cfg.Topic = "state"
	w.cfg.ClientOpts = seeds
	return w, seeds
}

// rsProducer is a transactional producer to the changelog, as an instance
// whose transactional ID is txid writes it.
func rsProducer(t *testing.T, seeds []kgo.Opt, txid string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(slices.Clip(seeds), kgo.TransactionalID(txid), kgo.DefaultProduceTopic("state"))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// restorer is w's restore, with its config as the test set it.
func (w *rsWorld) restorer() *Restorer { return New(w.cfg) }

// rec is a changelog record of st (a tombstone when st is nil).
func (w *rsWorld) rec(p int32, off int64, id string, st *task.State) *kgo.Record {
	w.t.Helper()
	r := &kgo.Record{Key: []byte(id), Partition: p, Offset: off}
	if st != nil {
		v, err := w.codec.EncodeState(nil, st)
		if err != nil {
			w.t.Fatal(err)
		}
		r.Value = v
	}
	return r
}

// restore applies windows of records as one restore does, the partitions in
// wiped restored from an empty store.
func (w *rsWorld) restore(wiped map[int32]bool, windows ...[]*kgo.Record) {
	w.t.Helper()
	rs := w.restorer().newWriter(wiped)
	for i, recs := range windows {
		if err := rs.add(recs, nil); err != nil {
			w.t.Fatal(err)
		}
		if i < len(windows)-1 {
			rs.endWindow()
		}
	}
	if err := rs.close(); err != nil {
		w.t.Fatal(err)
	}
}

// index lists the tasks in index ix of partition p (all due by the far
// future), as id@time.
func (w *rsWorld) index(ix store.Index, p int32) []string {
	w.t.Helper()
	ds, err := w.cfg.Store.Scan(ix, p, 1<<50, 1000)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, d := range ds {
		out = append(out, d.TaskID+"@"+itoa(d.NotBefore))
	}
	slices.Sort(out)
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (w *rsWorld) get(p int32, id string) *task.State {
	w.t.Helper()
	st, err := w.cfg.Store.Get(p, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return st
}

func pending(nb int64) *task.PendingRetry {
	return &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: nb}
}

// Guards the restore of a partition into an empty store: the store holds
// each task's last changelog state and exactly its index entries; a task
// whose last record is a tombstone leaves nothing, whether its earlier
// records were in the same window or an earlier one; the JSON states of
// earlier builds restore; the checkpoint is where the read stopped.
func TestRestoreWritesLastStatePerTask(t *testing.T) {
	w := rsStart(t)
	jsonState, err := json.Marshal(&task.State{TaskID: "json", Attempts: 2, Pending: pending(7_000), ExpiresAt: 9 * rsHour})
	if err != nil {
		t.Fatal(err)
	}
	w.restore(map[int32]bool{0: true},
		[]*kgo.Record{
			w.rec(0, 0, "twice", &task.State{TaskID: "twice", Attempts: 1, Pending: pending(1_000), ExpiresAt: 5 * rsHour}),
			w.rec(0, 1, "gone", &task.State{TaskID: "gone", Attempts: 1, Pending: pending(2_000), ExpiresAt: 5 * rsHour}),
			w.rec(0, 2, "later", &task.State{TaskID: "later", Attempts: 1, Review: task.ReviewOpen, ReviewDueAt: 3_000, ExpiresAt: 6 * rsHour}),
			w.rec(0, 3, "twice", &task.State{TaskID: "twice", Attempts: 2, ExpiresAt: 8 * rsHour}),
			w.rec(0, 4, "gone", nil),
			w.rec(0, 5, "never", nil),
			{Key: []byte("json"), Value: jsonState, Partition: 0, Offset: 6},
		},
		[]*kgo.Record{
			w.rec(0, 7, "later", &task.State{TaskID: "later", Attempts: 2, Review: task.ReviewApproved, Pending: pending(4_000), ExpiresAt: 7 * rsHour}),
			w.rec(0, 8, "dropped", &task.State{TaskID: "dropped", Attempts: 1, Pending: pending(5_000), ExpiresAt: 5 * rsHour}),
		},
		[]*kgo.Record{w.rec(0, 9, "dropped", nil)},
	)

	if st := w.get(0, "twice"); st == nil || st.Attempts != 2 || st.Pending != nil {
		t.Errorf("task written twice: %+v, want its second state (attempts 2, nothing pending)", st)
	}
	if st := w.get(0, "later"); st == nil || st.Attempts != 2 || st.Review != task.ReviewApproved {
		t.Errorf("task written in two windows: %+v, want its second state", st)
	}
	if st := w.get(0, "json"); st == nil || st.Attempts != 2 || st.Pending == nil || st.Pending.NotBefore != 7_000 {
		t.Errorf("JSON state of an earlier build: %+v, want it restored", st)
	}
	for _, id := range []string{"gone", "never", "dropped"} {
		if st := w.get(0, id); st != nil {
			t.Errorf("task %s, whose last record is a tombstone: state %+v, want none", id, st)
		}
	}
	if got, want := w.index(store.DueIndex, 0), []string{"json@7000", "later@4000"}; !slices.Equal(got, want) {
		t.Errorf("due index %v, want %v (only the last states' pending retries)", got, want)
	}
	if got, want := w.index(store.ExpiryIndex, 0), []string{"json@9", "later@7", "twice@8"}; !slices.Equal(got, want) {
		t.Errorf("expiry index %v, want %v (only the last states' buckets)", got, want)
	}
	if got := w.index(store.OverdueIndex, 0); len(got) != 0 {
		t.Errorf("overdue-review index %v, want empty (the open review item was approved)", got)
	}
	if next, ok, err := w.cfg.Store.Checkpoint(0); err != nil || !ok || next != 10 {
		t.Errorf("checkpoint %d (%v, %v), want 10", next, ok, err)
	}
	// the partition's tasks are known as its own: a wipe drops them all
	if had, err := w.cfg.Store.WipePartition(0); err != nil || !had {
		t.Errorf("wipe after the restore found no tasks (%v), want 3", err)
	}
	for _, id := range []string{"twice", "later", "json"} {
		if st := w.get(0, id); st != nil {
			t.Errorf("task %s after the wipe: %+v", id, st)
		}
	}
}

// Guards the restore from a trusted checkpoint: a partition whose local
// state was kept, and a task whose index entries the restore no longer
// remembers, have the index entries of the state the store held replaced,
// not left behind.
func TestRestoreReplacesStoredIndexEntries(t *testing.T) {
	w := rsStart(t)
	wb := w.cfg.Store.NewBatch()
	for _, st := range []*task.State{
		{TaskID: "kept", Attempts: 1, Pending: pending(1_000)},
		{TaskID: "finished", Attempts: 1, Pending: pending(2_000), Review: task.ReviewOpen, ReviewDueAt: 3_000},
	} {
		if err := wb.Put(1, nil, st, 5*rsHour); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	// partition 1 is kept (not wiped); partition 2 is wiped, and the
	// second window of its restore replaces what the first one wrote
	rs := w.restorer().newWriter(map[int32]bool{2: true})
	if err := rs.add([]*kgo.Record{
		w.rec(1, 10, "kept", &task.State{TaskID: "kept", Attempts: 2, Pending: pending(1_500), ExpiresAt: 6 * rsHour}),
		w.rec(1, 11, "finished", nil),
		w.rec(2, 0, "forgotten", &task.State{TaskID: "forgotten", Attempts: 1, Pending: pending(3_000), ExpiresAt: 5 * rsHour}),
	}, nil); err != nil {
		t.Fatal(err)
	}
	rs.endWindow()
	if err := rs.add([]*kgo.Record{w.rec(2, 1, "forgotten", &task.State{TaskID: "forgotten", Attempts: 2, ExpiresAt: 6 * rsHour})}, nil); err != nil {
		t.Fatal(err)
	}
	if err := rs.close(); err != nil {
		t.Fatal(err)
	}

	if st := w.get(1, "kept"); st == nil || st.Attempts != 2 || st.Pending == nil || st.Pending.NotBefore != 1_500 {
		t.Errorf("kept task: %+v, want its changelog state", st)
	}
	if st := w.get(1, "finished"); st != nil {
		t.Errorf("finished task: %+v, want none (tombstone)", st)
	}
	if got, want := w.index(store.DueIndex, 1), []string{"kept@1500"}; !slices.Equal(got, want) {
		t.Errorf("due index of the kept partition %v, want %v (the stored states' entries replaced)", got, want)
	}
	if got, want := w.index(store.ExpiryIndex, 1), []string{"kept@6"}; !slices.Equal(got, want) {
		t.Errorf("expiry index of the kept partition %v, want %v", got, want)
	}
	if got := w.index(store.OverdueIndex, 1); len(got) != 0 {
		t.Errorf("overdue-review index of the kept partition %v, want empty", got)
	}
	if got := w.index(store.DueIndex, 2); len(got) != 0 {
		t.Errorf("due index of the wiped partition %v, want empty (the forgotten task's first pending retry replaced)", got)
	}
	if got, want := w.index(store.ExpiryIndex, 2), []string{"forgotten@6"}; !slices.Equal(got, want) {
		t.Errorf("expiry index of the wiped partition %v, want %v", got, want)
	}
}

// Guards the order a restore writes a window in: by partition, then task
// ID, a task's records in the order read (its last one is kept), whether
// sorted on one core or on two.
func TestSortWritten(t *testing.T) {
	for _, n := range []int{0, 1, 100, 4096, 10_001} {
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		ws := make([]written, n)
		want := make([]string, n)
		for i := range ws {
			p, id := int32(rng.IntN(3)), fmt.Sprintf("task-%05d", rng.IntN(n/3+1))
			ws[i] = written{id: []byte(id), p: p, span: [2]int32{int32(i), int32(i + 1)}, n: int32(i)}
			want[i] = fmt.Sprintf("%d/%s/%08d", p, id, i)
		}
		slices.Sort(want)
		sortWritten(ws)
		seen := map[int32]bool{}
		for i, w := range ws {
			if got := fmt.Sprintf("%d/%s/%08d", w.p, w.id, w.span[0]); got != want[i] {
				t.Fatalf("n=%d: record %d is %s, want %s", n, i, got, want[i])
			}
			seen[w.span[0]] = true
		}
		if len(seen) != n {
			t.Fatalf("n=%d: %d distinct tasks after the sort, want %d", n, len(seen), n)
		}
	}
}

// Guards a restore in many windows, cut within fetches: each task ends with
// its last changelog state and exactly that state's index entries, whether
// its earlier states were in the same window (dropped) or in earlier ones
// (replaced), and the checkpoint is past the last record.
func TestRestoreInManyWindows(t *testing.T) {
	w := rsStart(t)
	defer func(n int) { restoreWindow = n }(restoreWindow)
	restoreWindow = 2 << 10 // a few records a window
	var recs []*kgo.Record
	last := map[string]*task.State{}
	off := int64(0)
	for round := range 6 {
		for i := range 20 {
			id := fmt.Sprintf("task-%02d", (i*7+round)%20)
			var st *task.State
			if (i+round)%5 != 0 { // every fifth write a tombstone
				st = &task.State{TaskID: id, Attempts: int32(round + 1), ExpiresAt: int64(round+1) * rsHour}
				if (i+round)%2 == 0 {
					st.Pending = pending(int64(1_000*round + i))
				}
			}
			recs = append(recs, w.rec(0, off, id, st))
			last[id] = st
			off++
		}
	}
	rs := w.restorer().newWriter(map[int32]bool{0: true})
	for i := 0; i < len(recs); i += 7 { // fetches of 7 records
		if err := rs.add(recs[i:min(i+7, len(recs))], nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := rs.close(); err != nil {
		t.Fatal(err)
	}
	var due, expiry []string
	for id, st := range last {
		got := w.get(0, id)
		switch {
		case st == nil && got != nil:
			t.Errorf("%s: %+v, want none (its last record is a tombstone)", id, got)
		case st != nil && (got == nil || got.Attempts != st.Attempts):
			t.Errorf("%s: %+v, want its last state (attempts %d)", id, got, st.Attempts)
		}
		if st != nil && st.Pending != nil {
			due = append(due, id+"@"+itoa(st.Pending.NotBefore))
		}
		if st != nil {
			expiry = append(expiry, id+"@"+itoa(st.ExpiresAt/rsHour))
		}
	}
	slices.Sort(due)
	slices.Sort(expiry)
	if got := w.index(store.DueIndex, 0); !slices.Equal(got, due) {
		t.Errorf("due index %v, want %v", got, due)
	}
	if got := w.index(store.ExpiryIndex, 0); !slices.Equal(got, expiry) {
		t.Errorf("expiry index %v, want %v", got, expiry)
	}
	if next, ok, err := w.cfg.Store.Checkpoint(0); err != nil || !ok || next != off {
		t.Errorf("checkpoint %d (%v, %v), want %d", next, ok, err, off)
	}
}

// Guards the garbage collector's settings around restores: relaxed while
// any restore runs (two at once share it), and as they were once the last
// one ends.
func TestRelaxGCRestoresSettings(t *testing.T) {
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	limit := debug.SetMemoryLimit(-1)
	undo1 := relaxGC()
	undo2 := relaxGC()
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Errorf("GC percent during two restores %d, want -1 (off below the memory limit)", p)
	}
	if l := debug.SetMemoryLimit(-1); l >= limit || l <= int64(restoreWindow) {
		t.Errorf("memory limit during restores %d, want below the process's %d and above a window", l, limit)
	}
	undo1()
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Errorf("GC percent while one restore still runs %d, want -1", p)
	}
	undo2()
	if p := debug.SetGCPercent(77); p != 77 {
		t.Errorf("GC percent after the restores %d, want 77 as before", p)
	}
	if l := debug.SetMemoryLimit(-1); l != limit {
		t.Errorf("memory limit after the restores %d, want %d as before", l, limit)
	}
}

// Guards how a restore splits its partitions into groups read one after
// the other: in partition order, every partition in exactly one group, a
// group of more than size offsets only when it is one partition.
func TestRestoreGroups(t *testing.T) {
	parts := map[int32]scan.Range{
		0: {Start: 0, End: 40}, 1: {Start: 10, End: 30}, 2: {Start: 0, End: 100},
		3: {Start: 5, End: 10}, 4: {Start: 0, End: 20}, 5: {Start: 0, End: 1},
	}
	groups := restoreGroups("state", parts, 60)
	var got [][]int32
	for _, g := range groups {
		ps := slices.Sorted(maps.Keys(g["state"]))
		for _, p := range ps {
			if g["state"][p] != parts[p] {
				t.Errorf("partition %d read over %+v, want %+v", p, g["state"][p], parts[p])
			}
		}
		got = append(got, ps)
	}
	want := [][]int32{{0, 1}, {2}, {3, 4, 5}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("groups %v, want %v", got, want)
	}
	if g := restoreGroups("state", nil, 60); len(g) != 0 {
		t.Errorf("groups of nothing: %v", g)
	}
}

// Guards the restore against records this build cannot read: a changelog
// record that does not decode (a state of a build outside the schema window,
// or bytes that are not a state) stops the restore with an error naming the
// record and its writer schema, and is counted. Nothing of its window is
// written and the checkpoint stays before it: the partition is not routed on
// the state before the record, and the next restore meets the record again.
func TestRestoreStopsAtAnUnreadableRecord(t *testing.T) {
	w := rsStart(t)
	newer := []byte{0xC3, 0x01, 0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01, 0x02, 0x04, 0x06}
	rs := w.restorer().newWriter(map[int32]bool{0: true})
	err := rs.add([]*kgo.Record{
		w.rec(0, 0, "before", &task.State{TaskID: "before", Attempts: 1, Pending: pending(1_000), ExpiresAt: 5 * rsHour}),
		{Topic: "faultrouter.state", Key: []byte("newer"), Value: newer, Partition: 0, Offset: 1},
		w.rec(0, 2, "after", &task.State{TaskID: "after", Attempts: 1, ExpiresAt: 5 * rsHour}),
	}, map[int32]int64{0: 3})
	if err == nil {
		err = rs.close()
	} else {
		rs.close()
	}
	if !errors.Is(err, ErrUnreadableState) {
		t.Fatalf("restore over an unreadable record: %v, want ErrUnreadableState", err)
	}
	for _, want := range []string{"faultrouter.state partition 0 offset 1", `task "newer"`, "writer schema fingerprint 0123456789abcdef"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	var m dto.Metric
	if err := w.cfg.Metrics.Unreadable.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 1 {
		t.Errorf("restore_unreadable_records_total = %v, want 1", n)
	}
	for _, id := range []string{"before", "after"} {
		if st := w.get(0, id); st != nil {
			t.Errorf("task %s restored from a window with an unreadable record: %+v", id, st)
		}
	}
	if next, ok, err := w.cfg.Store.Checkpoint(0); err != nil || (ok && next > 1) {
		t.Errorf("checkpoint %d (%v, %v), want none or at most 1: the unreadable record must be read again", next, ok, err)
	}
}

// Guards what a partition's new assignment trusts of its local state: the
// state of a partition this instance released is kept when the changelog
// has not moved since the release mark, or has moved only with this
// instance's own transactional writes (its batch in flight at the revoke:
// an eager rebalance revokes every partition, and under load a transaction
// is often open), and wiped once another instance's producer wrote to it.
func TestTrustOrWipeKeepsStateMovedOnlyByThisInstance(t *testing.T) {
	w, seeds := rsOnChangelog(t)
	ctx := context.Background()
	producer := func(txid string) *kgo.Client { return rsProducer(t, seeds, txid) }
	write := func(cl *kgo.Client, n int) int64 {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var last int64
		for i := range n {
			r, err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}).First()
			if err != nil {
				t.Fatal(err)
			}
			last = r.Offset
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		return last + 2 // past the commit marker
	}
	st := &task.State{TaskID: "kept", Attempts: 1, ExpiresAt: 5 * rsHour}
	ours, theirs := producer("router-a"), producer("router-b")

	// released at 3; only this instance's batch was written after it (the
	// marks have no time, as an earlier release wrote them: the state is
	// not caught up from them, see TestACatchUpFromTheReleaseMark)
	end := write(ours, 3)
	w.restore(map[int32]bool{0: true}, []*kgo.Record{w.rec(0, 0, "kept", st)})
	if err := w.cfg.Store.SetReleased(0, store.Release{End: 3}); err != nil {
		t.Fatal(err)
	}
	end = write(ours, 2)
	kept, err := w.restorer().trustOrWipe(ctx, ours, &catchUpLimits{}, 0, end)
	if err != nil || !kept || w.get(0, "kept") == nil {
		t.Fatalf("changelog moved only by this instance: kept %v (%v), state %+v; want the local state kept", kept, err, w.get(0, "kept"))
	}

	// released again; then another instance wrote
	if err := w.cfg.Store.SetReleased(0, store.Release{End: end}); err != nil {
		t.Fatal(err)
	}
	mark := end
	end = write(theirs, 1)
	kept, err = w.restorer().trustOrWipe(ctx, ours, &catchUpLimits{}, 0, end)
	if err != nil || kept || w.get(0, "kept") != nil {
		t.Fatalf("changelog written by another instance since %d: kept %v (%v), state %+v; want it wiped", mark, kept, err, w.get(0, "kept"))
	}
}

// Guards the restore of a partition that comes back to the instance that
// released it after another instance wrote to it (every partition in a
// rolling restart): while the mark is younger than half the changelog's
// delete.retention.ms, the local state is kept and only the records from
// its checkpoint are read, and what they say (a task deleted, one changed,
// one new) is what the store then holds; a mark as old as that, or a log
// some records were deleted from (here a task's only record, before the
// checkpoint), wipes the partition and restores it from the changelog's
// start.
func TestACatchUpFromTheReleaseMark(t *testing.T) {
	w, seeds := rsOnChangelog(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	const retention = time.Minute
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "delete.retention.ms", Value: kadm.StringPtr("60000")}}, "state"); err != nil {
		t.Fatal(err)
	}
	producer := func(txid string) *kgo.Client { return rsProducer(t, seeds, txid) }
	// write commits one transaction of states (a tombstone for nil) and
	// returns the changelog's end after it
	write := func(p *kgo.Client, sts map[string]*task.State) int64 {
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var last int64
		for _, id := range slices.Sorted(maps.Keys(sts)) {
			r := w.rec(0, 0, id, sts[id])
			out, err := p.ProduceSync(ctx, &kgo.Record{Key: r.Key, Value: r.Value}).First()
			if err != nil {
				t.Fatal(err)
			}
			last = out.Offset
		}
		if err := p.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		return last + 2 // past the commit marker
	}
	restored := func() float64 {
		var m dto.Metric
		if err := w.cfg.Metrics.Records.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	restore := func() (records float64) {
		before := restored()
		if err := w.restorer().Restore(ctx, cl, []int32{0}); err != nil {
			t.Fatal(err)
		}
		return restored() - before
	}
	attempts := func(id string) int32 {
		if st := w.get(0, id); st != nil {
			return st.Attempts
		}
		return 0
	}
	// release marks partition 0 released at end, at, with the store's
	// checkpoint, as MarkReleased does
	release := func(end int64, at time.Time) {
		cp, ok, err := w.cfg.Store.Checkpoint(0)
		if err != nil || !ok {
			t.Fatalf("checkpoint: %v %v", ok, err)
		}
		if err := w.cfg.Store.SetReleased(0, store.Release{End: end, At: at, Checkpoint: cp}); err != nil {
			t.Fatal(err)
		}
	}
	ours, theirs := producer("router-a"), producer("router-b")

	// this instance owned the partition and let it go; another then wrote
	end := write(ours, map[string]*task.State{"kept": {TaskID: "kept", Attempts: 1}, "gone": {TaskID: "gone", Attempts: 1},
		"old": {TaskID: "old", Attempts: 1}}) // offsets 0-2 (in key order), its marker 3
	if n := restore(); n != 3 {
		t.Fatalf("first restore read %v records, want 3", n)
	}
	release(end, time.Now())
	end = write(theirs, map[string]*task.State{"gone": nil, "kept": {TaskID: "kept", Attempts: 2}, "new": {TaskID: "new", Attempts: 1}})
	if n := restore(); n != 3 {
		t.Errorf("the partition back soon after its release: %v records read, want the 3 written since", n)
	}
	for id, want := range map[string]int32{"kept": 2, "gone": 0, "new": 1, "old": 1} {
		if got := attempts(id); got != want {
			t.Errorf("after the catch-up: %s at attempt %d, want %d (0: none)", id, got, want)
		}
	}

	// released again, the mark now half the retention old: a tombstone
	// written since may be gone, so the partition is restored from the start
	release(end, time.Now().Add(-retention/2))
	end = write(theirs, map[string]*task.State{"new": {TaskID: "new", Attempts: 2}})
	if n := restore(); n != 7 {
		t.Errorf("the partition back half the retention after its release: %v records read, want all 7 from the start", n)
	}
	for id, want := range map[string]int32{"kept": 2, "gone": 0, "new": 2, "old": 1} {
		if got := attempts(id); got != want {
			t.Errorf("after the restore from the start: %s at attempt %d, want %d (0: none)", id, got, want)
		}
	}

	// released again, recently, but the store was written after the mark
	// (a process that took the partition back, killed before the mark's
	// deletion reached the disk): its checkpoint is not the mark's
	cp, _, _ := w.cfg.Store.Checkpoint(0)
	if err := w.cfg.Store.SetReleased(0, store.Release{End: end, At: time.Now(), Checkpoint: cp - 1}); err != nil {
		t.Fatal(err)
	}
	end = write(theirs, map[string]*task.State{"new": {TaskID: "new", Attempts: 3}})
	if n := restore(); n != 8 {
		t.Errorf("a mark the store was written after: %v records read, want all 8 from the start", n)
	}

	// released again, recently; then records are deleted from the log's
	// start, up to but not past the checkpoint: old's only record with
	// them. The changelog holds nothing of old any more, and only a
	// restore from its start says so.
	release(end, time.Now())
	write(ours, map[string]*task.State{"new": {TaskID: "new", Attempts: 4}})
	write(theirs, map[string]*task.State{"kept": {TaskID: "kept", Attempts: 4}})
	drop := kadm.Offsets{}
	drop.Add(kadm.Offset{Topic: "state", Partition: 0, At: 3}) // past old's record at 2
	if _, err := adm.DeleteRecords(ctx, drop); err != nil {
		t.Fatal(err)
	}
	if n := restore(); n != 7 {
		t.Errorf("a log records were deleted from: %v records read, want the 7 left, from its start", n)
	}
	for id, want := range map[string]int32{"kept": 4, "gone": 0, "new": 4, "old": 0} {
		if got := attempts(id); got != want {
			t.Errorf("after the restore from the log's start: %s at attempt %d, want %d (0: none)", id, got, want)
		}
	}
}

// Guards the restore's index entries against the router's own write path:
// a changelog of tasks written many times (pending retries moved, review
// items opened and alerted, tombstones, tasks written again after their
// tombstone) restored in two parts, the second onto the store the first
// left (as a restart restores from its checkpoints), in windows and
// fetches of random sizes, must leave the store exactly as writing each
// record in turn with store.Batch does: the same states and the same
// entries in every time index, none stale and none missing.
func TestRestoreMatchesTheRecordsWrittenInTurn(t *testing.T) {
	defer func(n, c int) { restoreWindow, maxCarried = n, c }(restoreWindow, maxCarried)
	seeds := uint64(200)
	if testing.Short() {
		seeds = 40
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 17))
			restoreWindow = 1<<10 + rng.IntN(4<<10)
			// the later windows of a partition take the state before them
			// from memory, or, past maxCarried tasks, from the store
			maxCarried = []int{1 << 20, 10 + rng.IntN(30)}[seed%2]
			w := rsStart(t)
			ref := rsStart(t)
			const parts, ids = 3, 40
			var recs []*kgo.Record
			offs := [parts]int64{}
			last := map[string]*task.State{} // p/id: the reference's state
			for range 700 {
				p := int32(rng.IntN(parts))
				id := fmt.Sprintf("task-%d-%02d", p, rng.IntN(ids))
				var st *task.State
				if rng.IntN(8) != 0 {
					st = &task.State{TaskID: id, Attempts: int32(rng.IntN(9) + 1), ExpiresAt: int64(rng.IntN(96)+1) * rsHour}
					if rng.IntN(2) == 0 {
						st.Pending = pending(int64(rng.IntN(100_000)))
					}
					if rng.IntN(3) == 0 {
						st.Review, st.ReviewDueAt, st.ReviewAlerted = task.ReviewOpen, int64(rng.IntN(100_000)+1), rng.IntN(2) == 0
					}
				}
				recs = append(recs, w.rec(p, offs[p], id, st))
				offs[p]++
				// the reference: the record written in turn, replacing the
				// entries of the state before it
				key := fmt.Sprint(p, "/", id)
				b := ref.cfg.Store.NewBatch()
				var err error
				if st == nil {
					err = b.Delete(p, last[key])
				} else {
					err = b.PutEncoded(p, last[key], st, recs[len(recs)-1].Value)
				}
				if err == nil {
					err = b.Commit()
				}
				if err != nil {
					t.Fatal(err)
				}
				last[key] = st
			}
			cut := len(recs)/3 + rng.IntN(len(recs)/3)
			for part, wiped := range []map[int32]bool{{0: true, 1: true, 2: true}, {}} {
				todo := recs[:cut]
				if part == 1 {
					todo = recs[cut:]
				}
				rs := w.restorer().newWriter(wiped)
				for len(todo) > 0 {
					n := min(len(todo), 1+rng.IntN(40))
					if err := rs.add(todo[:n], nil); err != nil {
						t.Fatal(err)
					}
					todo = todo[n:]
					if rng.IntN(6) == 0 {
						rs.endWindow()
					}
				}
				if err := rs.close(); err != nil {
					t.Fatal(err)
				}
			}
			for key, want := range last {
				var p int32
				var id string
				fmt.Sscanf(key, "%d/%s", &p, &id)
				got := w.get(p, id)
				switch {
				case want == nil && got != nil:
					t.Errorf("%s: %+v, want none", key, got)
				case want != nil && (got == nil || got.Attempts != want.Attempts || got.ExpiresAt != want.ExpiresAt):
					t.Errorf("%s: %+v, want %+v", key, got, want)
				}
			}
			for p := range int32(parts) {
				for _, ix := range []store.Index{store.DueIndex, store.ExpiryIndex, store.OverdueIndex} {
					if got, want := w.index(ix, p), ref.index(ix, p); !slices.Equal(got, want) {
						t.Errorf("partition %d, index %c:\n got %v\nwant %v", p, ix, got, want)
					}
				}
				if next, ok, err := w.cfg.Store.Checkpoint(p); err != nil || !ok || next != offs[p] {
					t.Errorf("partition %d: checkpoint %d (%v, %v), want %d", p, next, ok, err, offs[p])
				}
			}
		})
	}
}

// Guards the path of every task that expired and came back: a tombstone of
// a task the store does not hold, then a new state of it, in one window.
// The tombstone writes nothing, so its span in the window is empty and
// starts where the new state's does; the restore keeps the task's last
// record by the order read, so the new state is there after every restore.
func TestRestoreKeepsTheStateAfterATombstoneOfAnAbsentTask(t *testing.T) {
	lost := 0
	for i := range 100 {
		rng := rand.New(rand.NewPCG(uint64(i), 33))
		w := rsStart(t)
		st := &task.State{TaskID: "task-back", Attempts: 2, ExpiresAt: 5 * rsHour, Pending: pending(int64(1000 + i))}
		// other tasks around it, so the window's sort is not an insertion sort
		var recs []*kgo.Record
		at := rng.IntN(60)
		for j := range 60 {
			if j == at {
				recs = append(recs, w.rec(0, int64(len(recs)), "task-back", nil), w.rec(0, int64(len(recs)+1), "task-back", st))
			}
			id := fmt.Sprintf("task-%c%02d", 'a'+rng.IntN(26), j)
			recs = append(recs, w.rec(0, int64(len(recs)), id, &task.State{TaskID: id, Attempts: 1, ExpiresAt: rsHour}))
		}
		w.restore(map[int32]bool{0: true}, recs)
		got := w.get(0, "task-back")
		if got == nil || got.Pending == nil || got.Pending.NotBefore != st.Pending.NotBefore {
			lost++
			continue
		}
		if due := w.index(store.DueIndex, 0); !slices.Contains(due, "task-back@"+itoa(st.Pending.NotBefore)) {
			t.Fatalf("restore %d: due index %v lacks task-back's pending retry", i, due)
		}
	}
	if lost > 0 {
		t.Fatalf("task-back lost its state after its tombstone in %d of 100 restores", lost)
	}
}
