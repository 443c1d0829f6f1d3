package control

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Redrive is one selected record's fate in a re-drive: the record to send,
// or why it is not sent.
type Redrive struct {
	// Source is the dead-letter or review record selected.
	Source *kgo.Record
	Step   *replay.Step
	// Out is the record for the target topic, nil when refused or skipped.
	Out *kgo.Record
	// Count is the re-drive count Out carries.
	Count int
	// Refused is set by the loop guard (wraps replay.ErrLoop) or the
	// unknown-outcome guard (wraps replay.ErrUnknownOutcome); Skipped says
	// why a record that is no dead letter or review item is left out.
	Refused error
	Skipped string
}

// At names the source record: topic/partition@offset.
func (r *Redrive) At() string {
	return fmt.Sprintf("%s/%d@%d", r.Source.Topic, r.Source.Partition, r.Source.Offset)
}

// RedriveOptions are an operator's re-drive instruction.
type RedriveOptions struct {
	// MaxRedrives is the loop guard: a record already re-driven this many
	// times is refused.
	MaxRedrives int
	// Reason is why, carried as faultrouter.redrive.reason.
	Reason string
	// Force also re-drives a write whose outcome is unknown; it needs a
	// Reason.
	Force bool
	// Operator names who re-drives, carried as faultrouter.redrive.operator
	// (the console's signed-in person); empty leaves the header out.
	Operator string
}

// PlanRedrive builds the records that re-drive found to target: the original
// bytes of a dead-lettered input, the re-encoded event of a routed record,
// with the lineage headers. A record already re-driven opt.MaxRedrives times
// is refused by the loop guard, and a write whose outcome is unknown unless
// opt forces it with a reason. It sends nothing.
func PlanRedrive(c *codec.Codec, found []replay.Found, target string, opt RedriveOptions) ([]Redrive, error) {
	out := make([]Redrive, 0, len(found))
	for i := range found {
		rec, st := found[i].Rec, &found[i].Step
		r := Redrive{Source: rec, Step: st, Count: replay.RedriveCount(rec.Headers)}
		if err := replay.Guard(r.Count, opt.MaxRedrives); err != nil {
			r.Refused = err
			out = append(out, r)
			continue
		}
		if err := replay.GuardUnknownOutcome(st.Event, st.Decision, opt.Force, opt.Reason); err != nil {
			r.Refused = err
			out = append(out, r)
			continue
		}
		if why := cutCopy(rec); why != "" {
			r.Skipped = why
			out = append(out, r)
			continue
		}
		var value []byte
		switch st.Kind {
		case replay.KindPoison:
			value = rec.Value
		case replay.KindRouted:
			if st.Event == nil {
				r.Skipped = "the routed record carries no event to re-drive"
				out = append(out, r)
				continue
			}
			v, err := c.EncodeTaskEvent(nil, st.Event)
			if err != nil {
				return nil, fmt.Errorf("control: %s: re-encoding task %s: %w", r.At(), st.TaskID, err)
			}
			value = v
		default:
			r.Skipped = fmt.Sprintf("a %s record is not a dead letter or review item", st.Kind)
			out = append(out, r)
			continue
		}
		var keep []kgo.RecordHeader
		for _, h := range rec.Headers {
			if st.Kind == replay.KindPoison || h.Key == codec.HeaderTraceparent {
				keep = append(keep, h)
			}
		}
		r.Count++
		lin := codec.Redrive{SourceTopic: rec.Topic, SourcePartition: rec.Partition, SourceOffset: rec.Offset,
			Count: r.Count, Reason: opt.Reason, Forced: opt.Force, Operator: opt.Operator}
		r.Out = &kgo.Record{Topic: target, Key: rec.Key, Value: value, Headers: replay.Lineage(keep, lin)}
		out = append(out, r)
	}
	return out, nil
}

// cutCopy says why a record holds only a cut copy of its input (a raw copy
// cut to fit the dead-letter topic, or a bounded copy of the event), which
// re-driving would send in place of the original; "" when it is whole.
func cutCopy(rec *kgo.Record) string {
	h := codec.ParseHeaders(rec.Headers)
	if e := h.Error; e != nil && e.OriginalBytes > 0 {
		return fmt.Sprintf("the dead letter holds only the first %d of the original %d bytes; the original is at %s/%d@%d", len(rec.Value), e.OriginalBytes, e.Topic, e.Partition, e.Offset)
	}
	if c := h.Copy; c != nil {
		where := "its input record"
		if c.Topic != "" {
			where = fmt.Sprintf("%s/%d@%d", c.Topic, c.Partition, c.Offset)
		}
		return fmt.Sprintf("the record holds a bounded copy of the event (%s cut); the whole event is at %s", strings.Join(c.Truncated, ","), where)
	}
	return ""
}

// Sendable returns the records of plan that are to be sent, in plan order.
func Sendable(plan []Redrive) []*kgo.Record {
	var recs []*kgo.Record
	for i := range plan {
		if plan[i].Out != nil {
			recs = append(recs, plan[i].Out)
		}
	}
	return recs
}

// ProduceTx produces recs in one transaction: all of them or none. Records of
// one task keep their order (same key, same partition, one producer).
func ProduceTx(ctx context.Context, opts []kgo.Opt, recs []*kgo.Record) error {
	host, _ := os.Hostname()
	txID := fmt.Sprintf("faultrouter-replay-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(txID), kgo.RecordDeliveryTimeout(30*time.Second))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("replay: begin transaction: %w", err)
	}
	perr := cl.ProduceSync(ctx, recs...).FirstErr()
	commit := kgo.TransactionEndTry(perr == nil)
	if err := cl.EndTransaction(context.WithoutCancel(ctx), commit); err != nil {
		return fmt.Errorf("replay: end transaction: %w (nothing was re-driven)", err)
	}
	if perr != nil {
		return fmt.Errorf("replay: produce: %w; transaction aborted, nothing was re-driven", perr)
	}
	return nil
}
