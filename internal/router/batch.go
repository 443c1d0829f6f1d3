package router

// batch.go is the working set of one poll batch: its records, inputs, task
// states and output, reused batch after batch.

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/internal/router/forward"
	"github.com/faultrouter/faultrouter/internal/router/sweep"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// batch is the reusable working set of one poll.
type batch struct {
	recs   []*kgo.Record // the records polled, in order
	inputs []input
	ids    []string
	states map[string]*task.State
	// tasks is what the batch keeps of each of its tasks besides its
	// working state, in one entry found with one look-up (taskOf)
	tasks      map[string]*taskOf
	slots      []taskOf     // what tasks points to: a block
	olds       []task.State // what taskOf.old points to: a block
	touched    []*taskOf    // the tasks touched, in order
	rebalances uint64       // Router.rebalances before the batch's commit
	began      uint64       // Router.rebalances when the batch began
	out        []*kgo.Record
	// outOf is, for each input, the span of out its routing queued
	// (origins)
	outOf       [][2]int32
	checkpoints map[int32]int64
	expired     []sweep.Expired // states the TTL forgets after commit (package sweep)
	forgotten   map[string]bool // the tasks of expired, by ID
	// parts are new partition counts this batch alerted about (package forward)
	parts *forward.Counts
	// mem holds the audit, routed and changelog records of the batch and
	// their values (emit.Arena); scratch is where a state is encoded first
	mem     emit.Arena
	scratch []byte
	// lastBody is, for a state's last event that is a whole copy of an
	// input of the batch, that input's value (codec.EncodeStateFrom)
	lastBody map[*event.TaskEvent][]byte
	// norm are the recs in the Confluent wire format, rewritten (package decode)
	norm []decode.Normalized
	// tally sums the metrics of the batch's inputs, added once it
	// committed (metrics.go)
	tally tally
}

func newBatch() *batch {
	return &batch{
		states:      map[string]*task.State{},
		tasks:       map[string]*taskOf{},
		checkpoints: map[int32]int64{},
		forgotten:   map[string]bool{},
		lastBody:    map[*event.TaskEvent][]byte{},
	}
}

func (b *batch) reset() {
	b.releaseRecords()
	b.ids = b.ids[:0]
	clear(b.states)
	clear(b.tasks)
	clear(b.slots)
	b.slots = b.slots[:0]
	clear(b.olds)
	b.olds = b.olds[:0]
	clear(b.touched)
	b.touched = b.touched[:0]
	clear(b.checkpoints)
	clear(b.expired)
	b.expired = b.expired[:0]
	clear(b.forgotten)
	b.parts = nil
	b.mem.Reset()
}

// releaseRecords drops a committed batch's input and output records (with
// the fetched buffers their values point into), which its Pebble write does
// not read, so that they are not kept alive while the next batch is handled:
// runSession alternates two batches, and a batch is otherwise reset only when
// it is used again.
func (b *batch) releaseRecords() {
	clear(b.recs)
	b.recs = b.recs[:0]
	clear(b.inputs)
	b.inputs = b.inputs[:0]
	clear(b.out)
	b.out = b.out[:0]
	b.outOf = b.outOf[:0]
	clear(b.lastBody) // input values too
	clear(b.norm)
	b.norm = b.norm[:0]
}

// taskOf is what a batch keeps of one of its tasks besides its working
// state: the partition its state is kept under, the index entries the store
// holds, whether the batch touched it and its changelog value.
type taskOf struct {
	id string
	// part is -1 until known; a touched task's is always known (touch and
	// Load name it)
	part int32
	// old is the state's index entries as the store holds them (Remember),
	// nil until remembered: what the batch's write of it replaces
	old     *task.State
	touched bool
	encoded []byte // the changelog value of a touched state (changelog)
}

// task returns the entry of task id, made with partition p if the batch
// has none yet.
func (b *batch) task(id string, p int32) *taskOf {
	if t, ok := b.tasks[id]; ok {
		if t.part < 0 {
			t.part = p
		}
		return t
	}
	if len(b.slots) == cap(b.slots) { // a new block; the last one is kept for the next batches
		b.slots = make([]taskOf, 0, max(256, 2*cap(b.slots)))
	}
	b.slots = b.slots[:len(b.slots)+1]
	t := &b.slots[len(b.slots)-1]
	t.id, t.part = id, p
	b.tasks[id] = t
	return t
}

// routedIDs lists the tasks the batch routes (ids), with the partition
// their state is kept under; a forwarded input is routed on its home
// partition, and needs no state here.
func (b *batch) routedIDs() {
	for i := range b.inputs {
		in := &b.inputs[i]
		if id := in.TaskID(); id != "" && in.Kind != decode.Forward {
			b.ids = append(b.ids, id)
			b.task(id, in.Rec.Partition)
		}
	}
}

// partition is the partition of task id in the batch: where its state is
// stored.
func (b *batch) partition(id string) int32 {
	if t, ok := b.tasks[id]; ok && t.part >= 0 {
		return t.part
	}
	return 0
}

// state returns the working state of a task, creating an empty one for a
// task the store does not know.
func (b *batch) state(id string, p int32) *task.State {
	st, ok := b.states[id]
	if !ok {
		st = &task.State{}
		b.states[id] = st
	}
	t := b.task(id, p)
	t.part = p
	if t.old == nil {
		b.remember(t, st)
	}
	return st
}

// Remember keeps the index entries of a state as the store holds them.
func (b *batch) Remember(st *task.State) {
	if st.TaskID != "" {
		b.remember(b.task(st.TaskID, -1), st)
	}
}

func (b *batch) remember(t *taskOf, st *task.State) {
	if st.TaskID == "" {
		return
	}
	if len(b.olds) == cap(b.olds) { // a new block; the last one is kept for the next batches
		b.olds = make([]task.State, 0, max(256, 2*cap(b.olds)))
	}
	b.olds = b.olds[:len(b.olds)+1]
	old := &b.olds[len(b.olds)-1]
	*old = task.State{TaskID: st.TaskID, ExpiresAt: st.ExpiresAt,
		Review: st.Review, ReviewDueAt: st.ReviewDueAt, ReviewAlerted: st.ReviewAlerted}
	if st.Pending != nil {
		p := *st.Pending
		old.Pending = &p
	}
	t.old = old
}

// origins maps each record the batch's inputs queued to its input, for a
// batch whose produce failed (package refuse): built only then.
func (b *batch) origins() map[*kgo.Record]*kgo.Record {
	m := make(map[*kgo.Record]*kgo.Record, len(b.out))
	for i, sp := range b.outOf {
		for _, rec := range b.out[sp[0]:sp[1]] {
			m[rec] = b.inputs[i].Rec
		}
	}
	return m
}

func (b *batch) touch(id string, p int32) {
	if id == "" {
		return
	}
	b.touchTask(b.task(id, p))
}

func (b *batch) touchTask(t *taskOf) {
	if !t.touched {
		t.touched = true
		b.touched = append(b.touched, t)
	}
}

// Load makes a state the store holds part of the batch and touches it.
func (b *batch) Load(st *task.State, p int32) {
	t := b.task(st.TaskID, p)
	if _, ok := b.states[st.TaskID]; !ok {
		b.states[st.TaskID] = st
		b.remember(t, st)
	}
	b.touchTask(t)
}

// Queue adds rec to the batch's output.
func (b *batch) Queue(rec *kgo.Record) { b.out = append(b.out, rec) }

// The batch as the sweep works on it (sweep.Batch).

// States are the batch's task states, by ID.
func (b *batch) States() map[string]*task.State { return b.states }

// Touched reports whether the batch touches task id.
func (b *batch) Touched(id string) bool {
	t, ok := b.tasks[id]
	return ok && t.touched
}

// Forgotten reports whether the batch forgets task id (Expire).
func (b *batch) Forgotten(id string) bool { return b.forgotten[id] }

// Expire makes the batch forget st, of partition p: tombstone goes out on
// the changelog, and the store deletes st once the batch commits.
func (b *batch) Expire(p int32, st *task.State, tombstone *kgo.Record) {
	b.forgotten[st.TaskID] = true
	b.out = append(b.out, tombstone)
	b.expired = append(b.expired, sweep.Expired{Partition: p, State: st})
}

// Expired are the states the batch forgets.
func (b *batch) Expired() []sweep.Expired { return b.expired }

// The batch as its transaction produces it (txn.Batch).

// Out returns the records the batch queued so far.
func (b *batch) Out() []*kgo.Record { return b.out }

// Checkpoint records that the batch's changelog records of partition p
// reach up to next.
func (b *batch) Checkpoint(p int32, next int64) {
	if next > b.checkpoints[p] {
		b.checkpoints[p] = next
	}
}
