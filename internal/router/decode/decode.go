// Package decode is the router's first step: a polled record in, an Input
// out. A record the router can route becomes a task event, a review
// decision or a breaker command; one it cannot becomes a poison input with
// an error kind (faultrouter.error.kind), which the router dead-letters
// with the original bytes. Records in the Confluent wire format are first
// rewritten into the single-object encoding by a Normalizer.
//
// Decoding reads only what does not change while a batch is handled (the
// codec, the size limit, the refused inputs), so a large batch is decoded
// on every core (Decoder.All).
package decode

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Kind is what a consumed record decoded as.
type Kind uint8

const (
	Task    Kind = iota // a TaskEvent from ingress
	Review              // a ReviewDecision from decisions
	Poison              // a record the router cannot accept
	Command             // a breaker command (BreakerEvent of kind RESET or LATCH) from decisions
	Forward             // a task event or review decision on the wrong partition for its task
)

// Input is one consumed record, decoded.
type Input struct {
	Rec *kgo.Record
	// Value is the record's value in the single-object encoding: Rec.Value,
	// or its rewrite from the Confluent wire format (Normalizer)
	Value   []byte
	Kind    Kind
	Event   event.TaskEvent
	Review  event.ReviewDecision
	Command event.BreakerEvent
	Err     error
	ErrKind string // faultrouter.error.kind of a poison record
	Home    int32  // the home partition of a misplaced input
	// Fwd is the kind a forwarded input was decoded as (Task or Review)
	Fwd Kind
	// Unwritable marks a valid task event (kind Poison) whose routed records
	// cannot be written (Config.Refused)
	Unwritable bool
}

// TaskID is the task of a task event or review decision, forwarded or not;
// "" for any other input.
func (in *Input) TaskID() string {
	kind := in.Kind
	if kind == Forward {
		kind = in.Fwd
	}
	switch kind {
	case Task:
		return in.Event.TaskID
	case Review:
		return in.Review.TaskID
	}
	return ""
}

// Error kinds of poison input, besides the codec's.
const (
	KindOversize    = "oversize"
	KindEmptyKey    = "empty_key"
	KindKeyMismatch = "key_mismatch"
)

// Config is what a Decoder reads.
type Config struct {
	Codec *codec.Codec
	// MaxRecordBytes bounds an input record's value
	MaxRecordBytes int
	// Decisions is the decisions topic's name: its records are review
	// decisions and breaker commands; every other topic's are task events
	Decisions string
	// Misplaced returns the home partition of a record on the wrong
	// partition for its task
	Misplaced func(rec *kgo.Record) (home int32, ok bool)
	// Refused, if set, is asked about every decoded input and may mark a
	// task event whose routed records cannot be written as Unwritable
	Refused func(in *Input)
}

// Decoder turns records into inputs.
type Decoder struct{ cfg Config }

// New returns a Decoder of cfg.
func New(cfg Config) *Decoder { return &Decoder{cfg: cfg} }

// Decode turns rec into an input, in place; n, if not nil, is rec's value
// rewritten into the single-object encoding. What cannot be routed becomes
// a poison input with an error kind.
func (d *Decoder) Decode(rec *kgo.Record, n *Normalized, in *Input) {
	d.decode(rec, n, in)
	if d.cfg.Refused != nil {
		d.cfg.Refused(in)
	}
}

func (d *Decoder) decode(rec *kgo.Record, n *Normalized, in *Input) {
	*in = Input{Rec: rec, Value: rec.Value}
	poison := func(kind string, err error) {
		in.Kind, in.ErrKind, in.Err = Poison, kind, err
	}
	if len(rec.Value) > d.cfg.MaxRecordBytes {
		poison(KindOversize, fmt.Errorf("record value is %d bytes, over the maximum of %d", len(rec.Value), d.cfg.MaxRecordBytes))
		return
	}
	if len(rec.Key) == 0 {
		poison(KindEmptyKey, errors.New("record has no key; the key must be the task_id"))
		return
	}
	if n != nil {
		if n.err != nil {
			poison(codec.Kind(n.err), n.err)
			return
		}
		in.Value = n.value
	}
	var id string
	if rec.Topic == d.cfg.Decisions {
		v, err := d.cfg.Codec.Decode(in.Value)
		if err != nil {
			poison(codec.Kind(err), err)
			return
		}
		switch x := v.(type) {
		case *event.ReviewDecision:
			in.Kind, in.Review, id = Review, *x, x.TaskID
		case *event.BreakerEvent:
			if x.Kind != event.BreakerKindReset && x.Kind != event.BreakerKindLatch {
				poison(codec.Kind(codec.ErrWrongSchema), fmt.Errorf("%w: a BreakerEvent on the decisions topic must be of kind %s or %s, got %q",
					codec.ErrWrongSchema, event.BreakerKindReset, event.BreakerKindLatch, x.Kind))
				return
			}
			in.Kind, in.Command = Command, *x
			return
		default:
			poison(codec.Kind(codec.ErrWrongSchema), fmt.Errorf("%w: the decisions topic carries ReviewDecision records and breaker commands, got %T", codec.ErrWrongSchema, v))
			return
		}
	} else {
		if err := d.cfg.Codec.DecodeTaskEventInto(in.Value, &in.Event); err != nil {
			in.Event = event.TaskEvent{}
			poison(codec.Kind(err), err)
			return
		}
		in.Kind, id = Task, in.Event.TaskID
	}
	if string(rec.Key) != id {
		poison(KindKeyMismatch, fmt.Errorf("record key %q differs from task_id %q", rec.Key, id))
		return
	}
	if home, ok := d.cfg.Misplaced(rec); ok {
		in.Fwd, in.Kind, in.Home = in.Kind, Forward, home
	}
}

// ParallelMin is the fewest records a core is given to decode: for fewer
// the goroutines cost more than they save. A batch is decoded on up to
// len/ParallelMin cores.
const ParallelMin = 256

// All decodes recs into the inputs at returns, in order (Decode); norm
// holds the rewrites of a Normalizer, or nothing. A large batch is decoded
// in parallel, in one contiguous slice per core: decoding is most of the
// CPU a batch spends before its first decision.
func (d *Decoder) All(recs []*kgo.Record, norm []Normalized, at func(i int) *Input) {
	decode := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var n *Normalized
			if i < len(norm) && norm[i].done {
				n = &norm[i]
			}
			d.Decode(recs[i], n, at(i))
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(recs)/ParallelMin)
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
