package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

type inputKind uint8

const (
	inputTask    inputKind = iota // a TaskEvent from ingress
	inputReview                   // a ReviewDecision from decisions
	inputPoison                   // a record the router cannot accept
	inputCommand                  // a breaker command (BreakerEvent of kind RESET or LATCH) from decisions
	inputForward                  // a task event or review decision on the wrong partition for its task (package forward)
)

// input is one consumed record, decoded.
type input struct {
	rec *kgo.Record
	// value is the record's value in the single-object encoding: rec.Value,
	// or its rewrite from the Confluent wire format (registry.go)
	value   []byte
	kind    inputKind
	event   event.TaskEvent
	review  event.ReviewDecision
	command event.BreakerEvent
	err     error
	errKind string // faultrouter.error.kind of a poison record
	home    int32  // the home partition of a misplaced input
	// fwd is the kind a forwarded input was decoded as (task or review)
	fwd inputKind
	// unwritable marks a valid task event (kind poison) whose routed records
	// cannot be written (unwritable.go)
	unwritable bool
	decision   event.Decision
	// state is the working state of the task the input was routed on
	// (route): a task event's or a review decision's, else nil
	state *task.State
	// started and finished tell that this event opened its task or brought
	// it to a terminal decision; taskMs is then the task's time to that
	// decision, on the events' clock.
	started, finished bool
	taskMs            int64
	// repeat says why a decided task event's usage is not counted (an
	// attempt already counted: a forward, a re-drive, a redelivery after the
	// TTL), "" when it is; prevented is the cost prevented its decision
	// claims (policy.Claim), nil for none. Both go on the audit record and
	// into the ledger's metrics (ledger.go).
	repeat    policy.Repeat
	prevented *event.Prevented
}

func (in *input) taskID() string {
	kind := in.kind
	if kind == inputForward {
		kind = in.fwd
	}
	switch kind {
	case inputTask:
		return in.event.TaskID
	case inputReview:
		return in.review.TaskID
	}
	return ""
}

// Error kinds of poison input, besides the codec's.
const (
	kindOversize    = "oversize"
	kindEmptyKey    = "empty_key"
	kindKeyMismatch = "key_mismatch"
)

// decode turns a consumed record into an input, in place; what cannot be
// routed becomes a poison input with an error kind.
func (r *Router) decode(rec *kgo.Record, n *normalized, in *input) {
	*in = input{rec: rec, value: rec.Value}
	poison := func(kind string, err error) {
		in.kind, in.errKind, in.err = inputPoison, kind, err
	}
	if len(rec.Value) > r.cfg.MaxRecordBytes {
		poison(kindOversize, fmt.Errorf("record value is %d bytes, over the maximum of %d", len(rec.Value), r.cfg.MaxRecordBytes))
		return
	}
	if len(rec.Key) == 0 {
		poison(kindEmptyKey, errors.New("record has no key; the key must be the task_id"))
		return
	}
	if n != nil {
		if n.err != nil {
			poison(codec.Kind(n.err), n.err)
			return
		}
		in.value = n.value
	}
	var id string
	if rec.Topic == r.cfg.Topics.Decisions {
		v, err := r.codec.Decode(in.value)
		if err != nil {
			poison(codec.Kind(err), err)
			return
		}
		switch x := v.(type) {
		case *event.ReviewDecision:
			in.kind, in.review, id = inputReview, *x, x.TaskID
		case *event.BreakerEvent:
			if x.Kind != event.BreakerKindReset && x.Kind != event.BreakerKindLatch {
				poison(codec.Kind(codec.ErrWrongSchema), fmt.Errorf("%w: a BreakerEvent on the decisions topic must be of kind %s or %s, got %q",
					codec.ErrWrongSchema, event.BreakerKindReset, event.BreakerKindLatch, x.Kind))
				return
			}
			in.kind, in.command = inputCommand, *x
			return
		default:
			poison(codec.Kind(codec.ErrWrongSchema), fmt.Errorf("%w: the decisions topic carries ReviewDecision records and breaker commands, got %T", codec.ErrWrongSchema, v))
			return
		}
	} else {
		if err := r.codec.DecodeTaskEventInto(in.value, &in.event); err != nil {
			in.event = event.TaskEvent{}
			poison(codec.Kind(err), err)
			return
		}
		in.kind, id = inputTask, in.event.TaskID
	}
	if string(rec.Key) != id {
		poison(kindKeyMismatch, fmt.Errorf("record key %q differs from task_id %q", rec.Key, id))
		return
	}
	if home, ok := r.fwd.Misplaced(rec); ok { // package forward
		in.fwd, in.kind, in.home = in.kind, inputForward, home
	}
}

// logDecision writes the event line of one routed input.
func (r *Router) logDecision(in *input) {
	d := &in.decision
	lvl := slog.LevelInfo
	if d.Route == event.RouteDeadLetter || d.Class == event.ClassInvalidInput {
		lvl = slog.LevelWarn
	}
	if !r.log.Enabled(context.Background(), lvl) { // the line's attributes would be built for nothing
		return
	}
	id := in.taskID()
	if id == "" {
		id = string(in.rec.Key)
	}
	// the record is built here, not by Logger.Log: a line per decision, and
	// Logger.Log also looks up its caller, which no handler here prints
	rec := slog.NewRecord(time.Now(), lvl, "routed", 0)
	rec.AddAttrs(slog.String("task_id", id), slog.String("topic", in.rec.Topic), slog.Int("partition", int(in.rec.Partition)),
		slog.Int64("offset", in.rec.Offset), slog.String("class", string(d.Class)), slog.String("route", string(d.Route)),
		slog.String("rule", d.Rule), slog.String("reason", d.Reason))
	if d.Override != "" {
		rec.AddAttrs(slog.String("override", d.Override))
	}
	_ = r.log.Handler().Handle(context.Background(), rec) // as Logger.Log, which drops a handler's error
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
			r.unw.checkWritable(&ins[i], r.limits) // unwritable.go
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

// decodeBatch takes the fetched records into the batch and decodes them
// into its inputs (decodeAll), in the single-object encoding
// (normalizeAll).
func (r *Router) decodeBatch(ctx context.Context, fetches kgo.Fetches, b *batch) error {
	fetches.EachRecord(func(rec *kgo.Record) { b.recs = append(b.recs, rec) })
	if cap(b.inputs) > 4*max(len(b.recs), parallelDecodeMin) {
		b.inputs = nil // a backlog drain's batches were larger: let their inputs go
	}
	b.inputs = slices.Grow(b.inputs, len(b.recs))[:len(b.recs)]
	if err := r.normalizeAll(ctx, b); err != nil { // registry.go: the Confluent wire format
		return err
	}
	r.decodeAll(b.recs, b.norm, b.inputs)
	r.metrics.consumed.Add(float64(len(b.inputs)))
	r.observeLag(fetches) // lag.go
	return nil
}
