// Package emit builds the router's output records, one part of its data
// path: the Routed records of a decision (the audit record, and the record
// of its route on the retry, review or dead-letter topic), the dead-letter
// copy of an input the router cannot accept, and the headers a bounded copy
// of an event carries. Records and their values are taken from the batch's
// memory (Arena), and written in the topics' wire format (the Confluent
// framing, when the router runs with a schema registry). Which records a
// decision emits is the router's (decide.go); how each is built is here.
package emit

import (
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

const (
	// DecisionSlack bounds what a routed record holds beyond the input's
	// own key, value and headers: the decision (its text fields are cut by
	// Bound), the input's location and the error headers.
	DecisionSlack = 48 << 10
	// Bounds of a decision's text fields on a routed record.
	maxReasonBytes      = 8 << 10
	maxFeedbackBytes    = 16 << 10
	maxUserMessageBytes = 4 << 10
	maxModelBytes       = 1 << 10
)

// Bound cuts the text fields of d to their bounds.
func Bound(d *event.Decision) {
	d.Reason = codec.Truncate(d.Reason, maxReasonBytes)
	d.Feedback = codec.Truncate(d.Feedback, maxFeedbackBytes)
	d.UserMessage = codec.Truncate(d.UserMessage, maxUserMessageBytes)
	d.SuggestedModel = codec.Truncate(d.SuggestedModel, maxModelBytes)
}

// Records builds output records with the router's codec, in its wire
// format. Used by the run loop's goroutine only (SetFramer included).
type Records struct {
	codec  *codec.Codec
	framer *registry.Framer // nil: the single-object encoding
	log    *slog.Logger
}

// New returns the builder of records encoded with c; log gets the error of
// a record that does not encode.
func New(c *codec.Codec, log *slog.Logger) *Records { return &Records{codec: c, log: log} }

// SetFramer makes f the records' wire format (nil: single-object).
func (e *Records) SetFramer(f *registry.Framer) { e.framer = f }

// Routed encodes a Routed record of decision d on topic: the event ev
// (nil for none; raw, when not nil, the bytes it was decoded from, whose
// body is copied rather than encoded again), the input src it answers, and
// the input's traceparent header and faultrouter.redrive.* lineage headers
// carried over (inHeaders). Its timestamp is the decision's: the audit and
// routed records of one decision carry the same time, so a timeline orders
// them by the data path, not by the millisecond each happened to be
// produced in. The record and its value are a's.
func (e *Records) Routed(a *Arena, topic string, ev *event.TaskEvent, raw []byte, d event.Decision, src event.Source, inHeaders []kgo.RecordHeader) *kgo.Record {
	Bound(&d) // a routed record is its input plus at most DecisionSlack
	rr := event.Routed{Event: ev, Decision: d, Input: src}
	v, err := e.codec.EncodeRoutedFrom(a.Bytes(routedSize(&d, &src, raw)), &rr, raw)
	if err != nil {
		// Only a bug can get here (the decision's enums are the policy's own);
		// keep the record with the error rather than lose it.
		e.log.Error("routed record does not encode", "err", err, "topic", topic)
		rr.Event = nil
		rr.Decision.Reason += " (event not encodable: " + err.Error() + ")"
		v, _ = e.codec.EncodeRouted(nil, &rr)
	}
	rec := a.Record()
	rec.Topic, rec.Value, rec.Timestamp = topic, e.framer.Frame(topic, v), d.DecidedAt.Time
	if ev != nil {
		rec.Key = append(a.Bytes(len(ev.TaskID)), ev.TaskID...)
	}
	rec.Headers = codec.Carried(inHeaders)
	return rec
}

// routedSize is room for the routed record of a decision, so that its
// encoding is written into one allocation: the input's bytes, the decision's
// strings and the input's topic, plus room for the varints, unions and the
// schema header of the rest.
func routedSize(d *event.Decision, src *event.Source, raw []byte) int {
	n := 160 + len(raw) + len(d.Rule) + len(d.Reason) + len(d.Feedback) + len(d.SuggestedModel) + len(d.UserMessage) + len(d.Override) + len(src.Topic)
	if d.Review != nil {
		n += len(d.Review.Owner) + len(d.Review.Priority)
	}
	if d.Prevented != nil {
		n += 32 + len(d.Prevented.Stop)
	}
	return n
}

// DeadLetterRaw is the dead-letter record, on topic, of an input record
// the router cannot accept: the original key, value and headers, plus the
// error headers (stage, kind and err).
func DeadLetterRaw(topic string, rec *kgo.Record, stage, kind string, err error, now time.Time) *kgo.Record {
	info := codec.ErrorInfo{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
		Stage: stage, Kind: kind, Message: err.Error()}
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+7)
	h = info.AppendHeaders(append(h, rec.Headers...))
	return &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: h, Timestamp: event.At(now).Time}
}

// CopyHeaders adds to hs, when the state's copy of the last event was cut to
// its bounds, the headers that say so and where the whole event is.
func CopyHeaders(st *task.State, hs []kgo.RecordHeader) []kgo.RecordHeader {
	if len(st.LastEventTruncated) == 0 {
		return hs
	}
	c := codec.EventCopy{Truncated: st.LastEventTruncated}
	if st.LastInput != nil {
		c.Topic, c.Partition, c.Offset = st.LastInput.Topic, st.LastInput.Partition, st.LastInput.Offset
	}
	return c.AppendHeaders(hs)
}

// MaxRawCopyBytes is how much of the original bytes a dead-letter copy
// keeps when the whole input does not fit the dead-letter topic (CutRaw).
const MaxRawCopyBytes = 64 << 10

// CutRaw bounds a raw dead-letter copy that does not fit the dead-letter
// topic: the value keeps its first MaxRawCopyBytes, the input's own headers
// are dropped, and faultrouter.error.truncated says how long the original
// value was (the original stays on the input topic at
// faultrouter.error.topic/partition/offset).
func CutRaw(dl *kgo.Record) {
	n := len(dl.Value)
	dl.Value = dl.Value[:min(n, MaxRawCopyBytes)]
	var hs []kgo.RecordHeader
	for _, h := range dl.Headers {
		if strings.HasPrefix(h.Key, codec.ErrorHeaderPrefix) {
			hs = append(hs, h)
		}
	}
	dl.Headers = append(hs, kgo.RecordHeader{Key: codec.HeaderErrorTruncated, Value: strconv.AppendInt(nil, int64(n), 10)})
}
