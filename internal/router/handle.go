package router

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// handle routes one poll batch in one Kafka transaction:
// consume -> decode -> dedup -> classify/decide -> produce -> commit, then
// updates the Pebble cache once the transaction has committed, in the
// background while the next batch is polled, decoded and routed
// (statesBefore, waitWritten). It reports whether the batch's transaction
// committed.
func (r *Router) handle(ctx context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches, b *batch) (committed bool, err error) {
	b.reset()
	now := r.cfg.Now()
	start := time.Now()
	// breakers.go: the batch's breaker changes are kept only if it commits
	r.brk.begin(now)
	r.brk.adoptShared(b, now) // breakertable.go: the other instances' breaker changes
	defer func() {
		if committed {
			r.brk.commit()
		} else {
			r.brk.rollback()
		}
		r.fwd.partitionsCommitted(b.parts, sess.Client(), committed) // forward.go
	}()

	// consume and decode
	fetches.EachRecord(func(rec *kgo.Record) { b.recs = append(b.recs, rec) })
	if cap(b.inputs) > 4*max(len(b.recs), parallelDecodeMin) {
		b.inputs = nil // a backlog drain's batches were larger: let their inputs go
	}
	b.inputs = slices.Grow(b.inputs, len(b.recs))[:len(b.recs)]
	if err := r.normalizeAll(ctx, b); err != nil { // registry.go: the Confluent wire format
		return false, err
	}
	r.decodeAll(b.recs, b.norm, b.inputs)
	r.metrics.consumed.Add(float64(len(b.inputs)))
	r.observeLag(fetches) // lag.go

	// dedup and task state: one batched read for every task of the poll.
	// The batch before may still be written to the store (its write runs
	// after its commit, in the background): the states it committed are
	// read from its changelog records, the states it forgot are gone, and
	// only the other tasks, whose keys that write does not touch, are read
	// from the store. The sweep, which reads the time indexes, waits for
	// the write (waitWritten, below).
	prev := r.writing
	r.writing = nil
	b.routedIDs()
	ids, err := r.statesBefore(prev, b)
	if err != nil {
		return false, err
	}
	if err := r.store.Load(ids, b.partition, b.states); err != nil {
		return false, err
	}
	r.forgetExpired(b, now) // expiry.go: an event after expiry starts fresh

	// The transaction of a batch with input begins before its first
	// decision: a record is produced as soon as it is queued (records are
	// final once queued), so the broker writes the first records while the
	// rest are decided, and the flush that ends the transaction waits only
	// for the last ones.
	var (
		mu       sync.Mutex
		prodErr  error
		failed   = map[*kgo.Record]error{}
		produced int  // b.out[:produced] are produced
		open     bool // the transaction has begun
	)
	begin := func() error {
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("router: begin transaction: %w", err)
		}
		open = true
		return nil
	}
	produce := func() {
		for _, rec := range b.out[produced:] {
			sess.Produce(ctx, rec, func(rec *kgo.Record, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if prodErr == nil {
						prodErr = err
					}
					failed[rec] = err
					return
				}
				if rec.Topic == r.cfg.Topics.State && rec.Offset+1 > b.checkpoints[rec.Partition] {
					b.checkpoints[rec.Partition] = rec.Offset + 1
				}
			})
		}
		produced = len(b.out)
	}
	if len(b.inputs) > 0 {
		if err := begin(); err != nil {
			return false, err
		}
	}

	// classify and decide, in input order, per task on the evolving state
	for i := range b.inputs {
		n := len(b.out)
		r.route(&b.inputs[i], b, now)
		b.outOf = append(b.outOf, [2]int32{int32(n), int32(len(b.out))})
		r.brk.observe(&b.inputs[i], b, now) // breakers.go: outcomes, transitions, alerts
		produce()
	}
	// the batch before is in the store before its time indexes are read
	if err := r.waitWritten(); err != nil {
		return false, err
	}
	// sweep.go: expiry, due retries and owner SLA alerts on the partitions
	// this instance owns, from one sweep over their time indexes
	if err := r.sweep(b, now); err != nil {
		return false, err
	}
	b.parts = r.fwd.watchPartitions(ctx, sess.Client(), b, now) // forward.go: partitions added at runtime
	if len(b.inputs) == 0 && len(b.touched) == 0 && len(b.expired) == 0 && len(b.out) == 0 {
		committed = true // nothing to write: keep what the passing of time changed
		return true, nil
	}
	r.changelog(b, now)

	// produce the rest and commit: one transaction
	if !open {
		if err := begin(); err != nil {
			return false, err
		}
	}
	produce()
	try := kgo.TryCommit
	if err := sess.Client().Flush(ctx); err != nil {
		return false, fmt.Errorf("router: flush: %w", err)
	}
	if prodErr != nil {
		r.log.Warn("produce failed; aborting the transaction", "err", prodErr)
		try = kgo.TryAbort
		r.rememberRefused(failed, b.origins()) // unwritable.go: dead-lettered when polled again
	}
	b.rebalances = r.rebalances.Load() // before the commit: a rebalance after it may replace its states
	ok, err := sess.End(kgo.PreTxnCommitFnContext(ctx, r.fence(sess.Client())), try)
	if err != nil {
		r.metrics.txAborted.Inc()
		return false, fmt.Errorf("router: end transaction: %w", err)
	}
	if !ok {
		r.metrics.txAborted.Inc()
		r.log.Info("transaction aborted; the batch will be consumed again", "records", len(b.inputs))
		if prodErr != nil {
			r.pause(ctx) // unwritable.go: no hot loop against a broker in trouble
		}
		return false, nil
	}
	r.metrics.txCommitted.Inc()
	r.observeCommitted(fetches) // lag.go
	r.backoff = 0
	for i := range b.inputs {
		delete(r.refused, at(b.inputs[i].rec))
	}
	committed = true

	// The transaction committed: now, and only now, update the cache. The
	// write runs while the next batch is polled, decoded and routed; that
	// batch takes this one's states from b (statesBefore) and waits for the
	// write before its sweep (waitWritten), and the assignment callbacks,
	// which restore and mark the store, wait for it too. b is not reused
	// until then: runSession alternates two batches.
	r.written.Lock()
	r.writing = b
	go func() {
		defer r.written.Unlock()
		if beforeStateWrite != nil {
			beforeStateWrite()
		}
		if err := r.persist(b, now); err != nil {
			r.writeErr = err
			return
		}
		r.metrics.batchSeconds.Observe(time.Since(start).Seconds())
	}()
	for i := range b.inputs {
		in := &b.inputs[i]
		if in.kind == inputForward {
			r.metrics.forwarded.WithLabelValues(in.rec.Topic).Inc()
			r.logDecision(in)
			continue
		}
		b.tally.add(r.metrics.routed, string(in.decision.Class), string(in.decision.Route), 1)
		r.metrics.countTask(&b.tally, in)
		switch {
		case in.kind == inputPoison:
			r.metrics.poison.WithLabelValues(in.errKind).Inc()
		case in.decision.Route == event.RouteDrop && in.kind == inputTask:
			r.metrics.dropped.Inc()
		}
		r.logDecision(in)
	}
	b.tally.flush(r.metrics)
	for _, rec := range b.out {
		if rec.Topic == r.cfg.Topics.Retry {
			r.metrics.retriesPublished.Inc()
		}
	}
	b.releaseRecords()
	return true, nil
}

// statesBefore puts in b.states the states of b's tasks that prev, the
// batch before whose store write may still run, committed: decoded from its
// changelog records, as the store will hold them. It returns the IDs of the
// tasks left to read from the store: neither touched nor forgotten by prev
// (a forgotten task starts afresh, as when the store no longer holds it).
// With no batch before (its write is done, or it did not commit), every ID
// is left to read. So it is after a rebalance since the batch before
// committed: a partition assigned again may have been restored from the
// changelog with states another instance committed meanwhile.
func (r *Router) statesBefore(prev, b *batch) ([]string, error) {
	if prev == nil {
		return b.ids, nil
	}
	if prev.rebalances != r.rebalances.Load() {
		// the store holds what the restore wrote once prev's write is done
		return b.ids, r.waitWritten()
	}
	ids := make([]string, 0, len(b.ids))
	for _, id := range b.ids {
		if _, ok := b.states[id]; ok {
			continue
		}
		if prev.forgotten[id] {
			continue
		}
		v := prev.encoded[id]
		if !prev.isTouched[id] || v == nil {
			ids = append(ids, id)
			continue
		}
		st, err := r.codec.DecodeState(v)
		if err != nil {
			return nil, fmt.Errorf("router: decode the state of %s committed by the batch before: %w", id, err)
		}
		b.states[id] = st
	}
	if slices.ContainsFunc(ids, func(id string) bool { return prev.isTouched[id] }) {
		// a touched state with no changelog record (it did not encode):
		// read it from the store once the write is done
		if err := r.waitWritten(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// beforeStateWrite, when set, runs before the Pebble write of each committed
// batch: a test holds the write back with it. Nil in production.
var beforeStateWrite func()

// waitWritten waits until the Pebble write of the last committed batch is
// done and returns its error, once.
func (r *Router) waitWritten() error {
	r.written.Lock()
	defer r.written.Unlock()
	err := r.writeErr
	r.writeErr = nil
	return err
}

// parallelDecodeMin is the fewest records a core is given to decode: for
// fewer the goroutines cost more than they save. A batch is decoded on up to
// len/parallelDecodeMin cores.
const parallelDecodeMin = 256

// decodeAll decodes recs into ins, in order. A large batch is decoded in
// parallel, in one contiguous slice per core: decoding reads only what does
// not change while a batch is handled (the codec, the size limits, the
// refused inputs), and it is most of the CPU a batch spends before the
// first decision.
func (r *Router) decodeAll(recs []*kgo.Record, norm []normalized, ins []input) {
	decode := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var n *normalized
			if i < len(norm) && norm[i].done {
				n = &norm[i]
			}
			r.decode(recs[i], n, &ins[i])
			r.checkWritable(&ins[i]) // unwritable.go
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(recs)/parallelDecodeMin)
	if workers <= 1 {
		decode(0, len(recs))
		return
	}
	var wg sync.WaitGroup
	per := (len(recs) + workers - 1) / workers
	for lo := per; lo < len(recs); lo += per {
		wg.Go(func() { decode(lo, min(lo+per, len(recs))) })
	}
	decode(0, per)
	wg.Wait()
}

// route decides one input record and queues its output records.
func (r *Router) route(in *input, b *batch, now time.Time) {
	switch in.kind {
	case inputPoison:
		if in.unwritable {
			r.routeUnwritable(in, b, now) // unwritable.go
			return
		}
		in.decision = policy.Poison(in.errKind, in.err, now)
		dl := r.deadLetterRaw(in, now)
		if !r.limits.fits(dl) {
			r.cutRaw(dl) // unwritable.go: the original bytes and error headers do not fit
		}
		b.out = append(b.out, dl)
		b.out = append(b.out, r.audit(b, in, nil))
		return
	case inputCommand:
		in.decision = r.brk.command(in, b, now) // breakers.go
		b.out = append(b.out, r.audit(b, in, nil))
		return
	case inputForward:
		b.out = append(b.out, r.fwd.forward(in, now)) // forward.go: its copy on its home partition
		var ev *event.TaskEvent
		if in.fwd == inputTask {
			ev = &in.event
		}
		b.out = append(b.out, r.audit(b, in, ev))
		return
	case inputReview:
		st := b.state(in.review.TaskID, in.rec.Partition)
		in.state = st
		in.decision = r.cfg.Policy.DecideReview(&in.review, st, now)
		r.trackReview(st, &in.decision, now)
		b.touch(st.TaskID, in.rec.Partition)
		n := len(b.out)
		r.emit(in, st.LastEvent, st, b, now)
		for _, rec := range b.out[n:] {
			rec.Headers = copyHeaders(st, rec.Headers)
		}
		return
	}
	ev := &in.event
	st := b.state(ev.TaskID, in.rec.Partition)
	in.state = st
	hdr := codec.ParseHeaders(in.rec.Headers)
	wasTerminal, isNew, last := st.Terminal, st.TaskID == "", st.LastEvent
	// dedup, re-drive, policy (redrive.go)
	in.decision = r.cfg.Policy.DecideEvent(ev, st, hdr.Redrive, now)
	if st.LastEvent != last { // the state keeps a bounded copy of this event
		st.LastInput = &event.Source{Topic: in.rec.Topic, Partition: in.rec.Partition, Offset: in.rec.Offset, Timestamp: event.At(in.rec.Timestamp)}
		if len(st.LastEventTruncated) == 0 { // a whole copy: its changelog record copies the input's body
			b.lastBody[st.LastEvent] = in.value
		}
	}
	if in.decision.Route != event.RouteDrop {
		in.started, in.finished = isNew, st.Terminal && !wasTerminal
		if isNew || st.FirstEventAt == 0 {
			st.FirstEventAt = ev.OccurredAt.Millis()
		}
		if in.finished {
			in.taskMs = ev.OccurredAt.Millis() - st.FirstEventAt
		}
		st.SetTraceparent(hdr.Traceparent)
		r.trackReview(st, &in.decision, now)
	}
	b.touch(ev.TaskID, in.rec.Partition)
	r.emit(in, ev, st, b, now)
}

// emit queues the audit record of in and the record of its route.
func (r *Router) emit(in *input, ev *event.TaskEvent, st *task.State, b *batch, now time.Time) {
	d := &in.decision
	switch d.Route {
	case event.RouteRetry:
		switch {
		case st.Pending == nil:
		case st.Pending.NotBefore > now.UnixMilli():
			r.brk.holdAhead(ev, st, in.rec.Partition, now) // breakers.go: held now if its breakers will refuse it when due
		case !r.brk.holdRetry(ev, st, in.rec.Partition, b, now):
			b.out = appendRetry(b.out, r.routed(b, r.cfg.Topics.Retry, in, ev, *d))
			st.Pending = nil
		}
	case event.RouteReview, event.RouteQuarantine:
		b.out = append(b.out, r.routed(b, r.cfg.Topics.Review, in, ev, *d))
	case event.RouteDeadLetter:
		b.out = append(b.out, r.routed(b, r.cfg.Topics.DeadLetter, in, ev, *d))
	case event.RouteComplete, event.RouteDrop:
	}
	b.out = append(b.out, r.audit(b, in, ev))
}

// publishDue publishes the pending retries that are due, of the tasks the
// batch touched: by its input or by the sweep of the due index.
func (r *Router) publishDue(b *batch, now time.Time) error {
	// tasks of this batch and of the due index alike
	for _, id := range b.touched {
		st := b.states[id]
		d, due := policy.RetryDue(st, now)
		if !due {
			continue
		}
		if r.brk.holdRetry(st.LastEvent, st, b.partOf[id], b, now) { // breakers.go: stays pending while a breaker is open
			continue
		}
		var hdr []kgo.RecordHeader
		if st.Traceparent != "" {
			hdr = []kgo.RecordHeader{{Key: codec.HeaderTraceparent, Value: []byte(st.Traceparent)}}
		}
		var src event.Source
		if st.LastInput != nil {
			src = *st.LastInput
		}
		rec := r.routedRecord(b, r.cfg.Topics.Retry, st.LastEvent, d, src, hdr)
		rec.Headers = copyHeaders(st, rec.Headers)
		b.out = appendRetry(b.out, rec)
		st.Pending = nil
		r.log.Info("retry due; publishing in this batch's transaction", "task_id", id, "topic", r.cfg.Topics.Retry, "partition", b.partOf[id], "retry", d.Retry.N)
	}
	return nil
}

// copyHeaders adds to hs, when the state's copy of the last event was cut to
// its bounds, the headers that say so and where the whole event is.
func copyHeaders(st *task.State, hs []kgo.RecordHeader) []kgo.RecordHeader {
	if len(st.LastEventTruncated) == 0 {
		return hs
	}
	c := codec.EventCopy{Truncated: st.LastEventTruncated}
	if st.LastInput != nil {
		c.Topic, c.Partition, c.Offset = st.LastInput.Topic, st.LastInput.Partition, st.LastInput.Offset
	}
	return c.AppendHeaders(hs)
}

// changelog queues one state record per task the batch touched, its expiry
// stamped; persist stores the same bytes once the transaction commits.
func (r *Router) changelog(b *batch, now time.Time) {
	for _, id := range b.touched {
		st := b.states[id]
		st.ExpiresAt = r.expiresAt(st, now)
		var err error
		b.scratch, err = r.codec.EncodeStateFrom(b.scratch[:0], st, b.lastBody[st.LastEvent])
		if err != nil { // a State always encodes; keep the batch going regardless
			r.log.Error("state does not encode", "task_id", id, "err", err)
			continue
		}
		rec := b.mem.record()
		rec.Topic, rec.Partition = r.cfg.Topics.State, b.partOf[id]
		rec.Key = append(b.mem.bytes(len(id)), id...)
		rec.Value = append(b.mem.bytes(len(b.scratch)), b.scratch...)
		if !r.limits.fits(rec) { // cannot happen within the bounds of pkg/task; never stop the partition for it
			r.log.Error("state record over the state topic's limit; keeping only what routing needs", "task_id", id, "bytes", len(rec.Value), "limit", r.limits.of(rec.Topic))
			st.Shrink()
			rec.Value, _ = r.codec.EncodeState(nil, st)
		}
		b.encoded[id] = rec.Value
		b.out = append(b.out, rec)
	}
}

// persist writes the committed states and changelog checkpoints to Pebble.
func (r *Router) persist(b *batch, now time.Time) error {
	size := 0 // a state's value, and its keys: task, member, owner and index entries, old ones deleted
	for _, id := range b.touched {
		size += len(b.encoded[id]) + 12*len(id) + 128
	}
	wb := r.store.NewBatchSize(size)
	for _, id := range b.touched {
		st, v := b.states[id], b.encoded[id]
		var err error
		if v != nil {
			err = wb.PutEncoded(b.partOf[id], b.old[id], st, v)
		} else {
			err = wb.Put(b.partOf[id], b.old[id], st, r.expiresAt(st, now))
		}
		if err != nil {
			wb.Discard()
			return err
		}
	}
	if err := r.forget(wb, b); err != nil {
		wb.Discard()
		return err
	}
	for p, next := range b.checkpoints {
		if err := wb.SetCheckpoint(p, next); err != nil {
			wb.Discard()
			return err
		}
	}
	return wb.Commit()
}

// expiresAt is when a task's state may be forgotten: 2 x SLA after its last
// event on the router clock, or never while an operation's outcome is unknown
// or a review item is open. A pending retry moves it to 2 x SLA after the
// retry's due time, so that the retry is published before its task can
// expire (expiry.go).
func (r *Router) expiresAt(st *task.State, now time.Time) int64 {
	if st.Review == task.ReviewOpen {
		return 0
	}
	for _, op := range st.Operations {
		if op.Kind == event.OpWrite && (op.State == event.OpSubmitted || op.State == event.OpUnknown) {
			return 0
		}
	}
	sla := st.SLAMs
	if sla <= 0 {
		sla = r.cfg.Policy.DefaultSLAMs
	}
	from := now.UnixMilli()
	if st.Pending != nil {
		from = max(from, st.Pending.NotBefore)
	}
	return from + 2*sla
}

// batch is the reusable working set of one poll.
type batch struct {
	recs       []*kgo.Record // the records polled, in order
	inputs     []input
	ids        []string
	states     map[string]*task.State
	old        map[string]*task.State // index entries the store holds, per task
	olds       []task.State           // what old points to: remember's block
	partOf     map[string]int32
	touched    []string
	rebalances uint64 // Router.rebalances before the batch's commit
	isTouched  map[string]bool
	encoded    map[string][]byte // the changelog value of each touched state
	out        []*kgo.Record
	// outOf is, for each input, the span of out its routing queued
	// (origins)
	outOf       [][2]int32
	checkpoints map[int32]int64
	expired     []expiredTask   // states the TTL forgets after commit (expiry.go)
	forgotten   map[string]bool // the tasks of expired, by ID (sweep.go)
	// parts are new partition counts this batch alerted about (forward.go)
	parts *partitionCounts
	// mem holds the audit, routed and changelog records of the batch and
	// their values (arena.go); scratch is where a state is encoded first
	mem     arena
	scratch []byte
	// lastBody is, for a state's last event that is a whole copy of an
	// input of the batch, that input's value (codec.EncodeStateFrom)
	lastBody map[*event.TaskEvent][]byte
	// norm are the recs in the Confluent wire format, rewritten (registry.go)
	norm []normalized
	// tally sums the metrics of the batch's inputs, added once it
	// committed (metrics.go)
	tally tally
}

func newBatch() *batch {
	return &batch{
		states:      map[string]*task.State{},
		old:         map[string]*task.State{},
		partOf:      map[string]int32{},
		isTouched:   map[string]bool{},
		encoded:     map[string][]byte{},
		checkpoints: map[int32]int64{},
		forgotten:   map[string]bool{},
		lastBody:    map[*event.TaskEvent][]byte{},
	}
}

func (b *batch) reset() {
	b.releaseRecords()
	b.ids = b.ids[:0]
	clear(b.states)
	clear(b.old)
	clear(b.olds)
	b.olds = b.olds[:0]
	clear(b.partOf)
	b.touched = b.touched[:0]
	clear(b.isTouched)
	clear(b.encoded)
	clear(b.checkpoints)
	clear(b.expired)
	b.expired = b.expired[:0]
	clear(b.forgotten)
	b.parts = nil
	b.mem.reset()
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

// routedIDs lists the tasks the batch routes (ids), with the partition
// their state is kept under (partOf); a forwarded input is routed on its
// home partition, and needs no state here.
func (b *batch) routedIDs() {
	for i := range b.inputs {
		in := &b.inputs[i]
		if id := in.taskID(); id != "" && in.kind != inputForward {
			b.ids = append(b.ids, id)
			if _, ok := b.partOf[id]; !ok {
				b.partOf[id] = in.rec.Partition
			}
		}
	}
}

// partition is the partition of task id in the batch (partOf): where its
// state is stored.
func (b *batch) partition(id string) int32 { return b.partOf[id] }

// state returns the working state of a task, creating an empty one for a
// task the store does not know.
func (b *batch) state(id string, p int32) *task.State {
	st, ok := b.states[id]
	if !ok {
		st = &task.State{}
		b.states[id] = st
	}
	if _, ok := b.old[id]; !ok {
		b.remember(st)
	}
	b.partOf[id] = p
	return st
}

// remember keeps the index entries of a state as the store holds them.
func (b *batch) remember(st *task.State) {
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
	b.old[st.TaskID] = old
}

// origins maps each record the batch's inputs queued to its input, for a
// batch whose produce failed (unwritable.go): built only then.
func (b *batch) origins() map[*kgo.Record]*kgo.Record {
	m := make(map[*kgo.Record]*kgo.Record, len(b.out))
	for i, sp := range b.outOf {
		for _, rec := range b.out[sp[0]:sp[1]] {
			m[rec] = b.inputs[i].rec
		}
	}
	return m
}

func (b *batch) touch(id string, p int32) {
	if id == "" {
		return
	}
	if _, ok := b.partOf[id]; !ok {
		b.partOf[id] = p
	}
	if !b.isTouched[id] {
		b.isTouched[id] = true
		b.touched = append(b.touched, id)
	}
}

// fence returns the function that completes a transaction's offset commit
// with the committed offset of every partition this instance owns that the
// transaction did not consume. The broker checks the group generation and
// member of an offset commit, so every transaction is fenced by the group,
// including one that consumed nothing and only publishes due retries, alerts
// or tombstones: an instance that was paused past its session timeout (its
// partitions now another's) has such a transaction aborted instead of
// publishing, a second time, a retry its successor published. franz-go skips
// the offset commit of a transaction that consumed nothing; it calls this
// function before that check, under its transaction lock, so it only
// mutates the request. A partition with no committed offset yet is left out.
func (r *Router) fence(cl *kgo.Client) func(*kmsg.TxnOffsetCommitRequest) error {
	owned := r.ownedPartitions()
	committed := cl.CommittedOffsets()
	return func(req *kmsg.TxnOffsetCommitRequest) error {
		for _, topic := range []string{r.cfg.Topics.Ingress, r.cfg.Topics.Decisions} {
			ti := slices.IndexFunc(req.Topics, func(t kmsg.TxnOffsetCommitRequestTopic) bool { return t.Topic == topic })
			for _, p := range owned {
				eo, ok := committed[topic][p]
				if !ok || eo.Offset < 0 {
					continue
				}
				if ti < 0 {
					t := kmsg.NewTxnOffsetCommitRequestTopic()
					t.Topic = topic
					req.Topics = append(req.Topics, t)
					ti = len(req.Topics) - 1
				}
				rt := &req.Topics[ti]
				if slices.ContainsFunc(rt.Partitions, func(x kmsg.TxnOffsetCommitRequestTopicPartition) bool { return x.Partition == p }) {
					continue // consumed in this transaction: its new offset is there
				}
				rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
				rp.Metadata = &req.MemberID
				rt.Partitions = append(rt.Partitions, rp)
			}
		}
		return nil
	}
}
