package codec

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// The record headers are part of the wire contract, beside the schemas: the
// router writes them, tail, replay and the router itself read them back, all
// through this file. avro/README.md lists them for clients in other
// languages.
//
// A dead-lettered record carries faultrouter.error.* headers (like Kafka
// Connect's __connect.errors.*): where its input came from, at which stage it
// failed and why. A re-driven record (replay --redrive-to) carries
// faultrouter.redrive.* lineage headers: the record it was re-driven from,
// how many times its lineage was re-driven, and the operator's reason. Input
// headers are otherwise opaque, except the W3C trace context (traceparent),
// which the router carries to every record it routes from an input.
const (
	HeaderTraceparent = "traceparent"

	HeaderEventTruncated = "faultrouter.event.truncated" // the record's event is a bounded copy: the fields cut, comma-separated
	HeaderEventSource    = "faultrouter.event.source"    // where the whole event is: topic/partition@offset

	ErrorHeaderPrefix    = "faultrouter.error."
	HeaderErrorTopic     = "faultrouter.error.topic"     // input topic
	HeaderErrorPartition = "faultrouter.error.partition" // input partition
	HeaderErrorOffset    = "faultrouter.error.offset"    // input offset
	HeaderErrorTimestamp = "faultrouter.error.timestamp" // input record time, Unix ms
	HeaderErrorStage     = "faultrouter.error.stage"     // one of the Stage* values
	HeaderErrorKind      = "faultrouter.error.kind"      // short machine name of the failure
	HeaderErrorMessage   = "faultrouter.error.message"   // what went wrong, for people
	HeaderErrorClass     = "faultrouter.error.class"     // the decision's class (stages route, write)
	HeaderErrorTruncated = "faultrouter.error.truncated" // the value holds only the first bytes of the original, whose length this is

	RedriveHeaderPrefix       = "faultrouter.redrive."
	HeaderRedriveSourceTopic  = "faultrouter.redrive.source.topic"     // where the re-driven record was: topic,
	HeaderRedriveSourcePart   = "faultrouter.redrive.source.partition" // partition
	HeaderRedriveSourceOffset = "faultrouter.redrive.source.offset"    // and offset
	HeaderRedriveCount        = "faultrouter.redrive.count"            // re-drives of this lineage, 1 for the first
	HeaderRedriveReason       = "faultrouter.redrive.reason"           // the operator's --reason, if given
	HeaderRedriveForced       = "faultrouter.redrive.forced"           // "true": --force overrode the unknown-outcome guard
	HeaderRedriveOperator     = "faultrouter.redrive.operator"         // who re-drove it, when known (the console's signed-in person)

	// HeaderForwardedFrom is, on a task event or review decision the router
	// forwarded to its task's partition, "<topic>/<partition>/<offset>" of
	// the record it copies.
	HeaderForwardedFrom = "faultrouter.forwarded.from"

	// HeaderRepeat is, on the audit record of a task event whose attempt
	// was already counted (its usage is not counted again), why: forwarded
	// (the copy on its task's partition is the attempt), redrive (an
	// operator's re-drive) or redelivery_after_ttl (an event the task's
	// state had outlived). The cost ledger reads it.
	HeaderRepeat = "faultrouter.attempt.repeat"

	// HeaderBreakerInstance names, on a record of the breakers topic, the
	// router instance that wrote it; on a latch item's tombstone it is the
	// only sign of its writer.
	HeaderBreakerInstance = "faultrouter.breaker.instance"
	// HeaderBreakerResetOffset is, on the tombstone of a RESET record of
	// the breakers topic, the offset of the RESET it removes (decimal), so
	// that a reader that has read a newer RESET of the breaker keeps it.
	HeaderBreakerResetOffset = "faultrouter.breaker.reset.offset"
	// HeaderBreakerAfterReset is, on a failure-rate state record of the
	// breakers topic, the offset of the breaker's last RESET that its
	// writer had applied when it derived the state (decimal; -1 for none):
	// a reader that has read a later RESET of the breaker skips it, as a
	// state derived from what that RESET ended.
	HeaderBreakerAfterReset = "faultrouter.breaker.after.reset"
	// HeaderBreakerAdoptedFrom is, on a TRANSITION of the alerts topic that
	// an instance took from the breakers topic rather than made itself, the
	// instance whose change it adopted (its own ID for a state an earlier
	// process of it wrote).
	HeaderBreakerAdoptedFrom = "faultrouter.breaker.adopted_from"
	// HeaderBreakerLatched is, on every TRANSITION, "true" when it left the
	// breaker latched OPEN (until a person resets it), else "false".
	HeaderBreakerLatched = "faultrouter.breaker.latched"
	// HeaderAlert names, on every ALERT of the alerts topic, what it is
	// about: one of the Alert* values.
	HeaderAlert = "faultrouter.alert"
)

// Values of HeaderAlert.
const (
	AlertQuarantined   = "quarantined"    // a hallucination's output quarantined (scope PROMPT_TEMPLATE)
	AlertBudget        = "budget"         // a task's budget exhausted (scope TASK)
	AlertSurge         = "surge"          // one class rising for a template or model
	AlertReviewOverdue = "review_overdue" // a review item open past its owner's SLA (scope TASK)
	AlertPartitions    = "partitions"     // a topic's partition count changed (scope TOPIC)
	AlertRegistry      = "registry"       // the schema registry cannot be reached
)

// maxErrorMessageHeaderBytes bounds the text headers the router writes.
const maxErrorMessageHeaderBytes = 4 << 10

// Stages of faultrouter.error.stage. The stage also says what the value of a
// dead-letter record holds.
const (
	// StageDecode: the input's bytes do not decode; the value is the
	// original bytes.
	StageDecode = "decode"
	// StageValidate: the input decodes but breaks the contract (no key, key
	// differs from task_id, over --max-record-bytes, invalid field); the
	// value is the original bytes.
	StageValidate = "validate"
	// StageRoute: the policy decided DEADLETTER; the value is a
	// RoutedRecord with the event and the decision.
	StageRoute = "route"
	// StageWrite: the input was valid, but a record routed from it cannot
	// be written for a deterministic reason (too large for its topic,
	// rejected by the broker as invalid); the value is a RoutedRecord with
	// a bounded copy of the event, and the original stays on the input
	// topic at faultrouter.error.topic/partition/offset.
	StageWrite = "write"
)

// ErrorInfo is what the faultrouter.error.* headers say.
type ErrorInfo struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time // zero when absent
	Stage     string
	Kind      string
	Message   string
	Class     string
	// OriginalBytes is set when the value is cut: the original value's
	// length (the original is on the input topic at Topic/Partition/Offset).
	OriginalBytes int64
}

// Raw reports whether the record's value is the input's original bytes
// (stages decode and validate, and any stage this build does not know)
// rather than a RoutedRecord.
func (e *ErrorInfo) Raw() bool {
	return e != nil && e.Stage != StageRoute && e.Stage != StageWrite
}

// Redrive is the lineage of a re-driven record (faultrouter.redrive.*
// headers); its home is pkg/event, so that the policy reads it without the
// codec.
type Redrive = event.Redrive

// EventCopy says that a record's event is the task state's bounded copy of
// an input event, cut to fit (faultrouter.event.* headers): a retry
// published when due, or on a review approval, carries the copy.
type EventCopy struct {
	// Truncated are the JSON names of the fields cut, e.g. output.text.
	Truncated []string
	// Topic, Partition and Offset locate the input record that holds the
	// whole event; Topic is empty when unknown.
	Topic     string
	Partition int32
	Offset    int64
}

// AppendHeaders appends the faultrouter.event.* headers of c to hs.
func (c *EventCopy) AppendHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	hs = append(hs, kgo.RecordHeader{Key: HeaderEventTruncated, Value: []byte(strings.Join(c.Truncated, ","))})
	if c.Topic != "" {
		src := c.Topic + "/" + strconv.Itoa(int(c.Partition)) + "@" + strconv.FormatInt(c.Offset, 10)
		hs = append(hs, kgo.RecordHeader{Key: HeaderEventSource, Value: []byte(src)})
	}
	return hs
}

// Headers are a record's contract headers, parsed.
type Headers struct {
	// Error is nil without faultrouter.error.* headers.
	Error *ErrorInfo
	// Redrive is nil without a faultrouter.redrive.count of at least 1.
	Redrive *Redrive
	// Traceparent is the W3C trace context, empty without one.
	Traceparent string
	// Copy is nil unless the record's event is a bounded copy.
	Copy *EventCopy
}

// ParseHeaders reads the contract headers of a record. It never fails: a
// header that does not parse reads as absent (a number as 0). When a header
// repeats, the last one wins.
func ParseHeaders(hs []kgo.RecordHeader) Headers {
	var h Headers
	var rd Redrive
	for _, x := range hs {
		v := string(x.Value)
		switch {
		case x.Key == HeaderTraceparent:
			h.Traceparent = v
		case x.Key == HeaderEventTruncated:
			if h.Copy == nil {
				h.Copy = &EventCopy{}
			}
			h.Copy.Truncated = strings.Split(v, ",")
		case x.Key == HeaderEventSource:
			if h.Copy == nil {
				h.Copy = &EventCopy{}
			}
			h.Copy.Topic, h.Copy.Partition, h.Copy.Offset = parseAt(v)
		case strings.HasPrefix(x.Key, ErrorHeaderPrefix):
			if h.Error == nil {
				h.Error = &ErrorInfo{}
			}
			e := h.Error
			switch x.Key {
			case HeaderErrorTopic:
				e.Topic = v
			case HeaderErrorPartition:
				e.Partition = int32(atoi(v))
			case HeaderErrorOffset:
				e.Offset = atoi(v)
			case HeaderErrorTimestamp:
				if ms := atoi(v); ms > 0 {
					e.Timestamp = time.UnixMilli(ms).UTC()
				}
			case HeaderErrorStage:
				e.Stage = v
			case HeaderErrorKind:
				e.Kind = v
			case HeaderErrorMessage:
				e.Message = v
			case HeaderErrorClass:
				e.Class = v
			case HeaderErrorTruncated:
				e.OriginalBytes = atoi(v)
			}
		case x.Key == HeaderRedriveSourceTopic:
			rd.SourceTopic = v
		case x.Key == HeaderRedriveSourcePart:
			rd.SourcePartition = int32(atoi(v))
		case x.Key == HeaderRedriveSourceOffset:
			rd.SourceOffset = atoi(v)
		case x.Key == HeaderRedriveCount:
			rd.Count = int(atoi(v))
		case x.Key == HeaderRedriveReason:
			rd.Reason = v
		case x.Key == HeaderRedriveForced:
			rd.Forced = v == "true"
		case x.Key == HeaderRedriveOperator:
			rd.Operator = v
		}
	}
	if rd.Count > 0 {
		r := rd // only a re-driven record's headers take an allocation
		h.Redrive = &r
	}
	return h
}

// parseAt reads topic/partition@offset; a value that does not parse reads as
// an empty topic.
func parseAt(s string) (string, int32, int64) {
	at := strings.LastIndexByte(s, '@')
	slash := strings.LastIndexByte(s, '/')
	if at < 0 || slash < 0 || slash > at {
		return "", 0, 0
	}
	return s[:slash], int32(atoi(s[slash+1 : at])), atoi(s[at+1:])
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// AppendHeaders appends the faultrouter.error.* headers of e to hs. Empty
// fields are left out, except the stage, kind and message; the message is
// cut to 4 KiB.
func (e *ErrorInfo) AppendHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	add := func(k, v string) {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if e.Topic != "" {
		add(HeaderErrorTopic, e.Topic)
		add(HeaderErrorPartition, strconv.Itoa(int(e.Partition)))
		add(HeaderErrorOffset, strconv.FormatInt(e.Offset, 10))
	}
	if !e.Timestamp.IsZero() {
		add(HeaderErrorTimestamp, strconv.FormatInt(e.Timestamp.UnixMilli(), 10))
	}
	add(HeaderErrorStage, e.Stage)
	if e.Class != "" {
		add(HeaderErrorClass, e.Class)
	}
	add(HeaderErrorKind, e.Kind)
	add(HeaderErrorMessage, Truncate(e.Message, maxErrorMessageHeaderBytes))
	return hs
}

// AppendRedriveHeaders appends the faultrouter.redrive.* headers of r to hs.
func AppendRedriveHeaders(hs []kgo.RecordHeader, r *Redrive) []kgo.RecordHeader {
	add := func(k, v string) {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	add(HeaderRedriveSourceTopic, r.SourceTopic)
	add(HeaderRedriveSourcePart, strconv.Itoa(int(r.SourcePartition)))
	add(HeaderRedriveSourceOffset, strconv.FormatInt(r.SourceOffset, 10))
	add(HeaderRedriveCount, strconv.Itoa(r.Count))
	if r.Reason != "" {
		add(HeaderRedriveReason, Truncate(r.Reason, maxErrorMessageHeaderBytes))
	}
	if r.Forced {
		add(HeaderRedriveForced, "true")
	}
	if r.Operator != "" {
		add(HeaderRedriveOperator, Truncate(r.Operator, maxErrorMessageHeaderBytes))
	}
	return hs
}

// WithoutContract returns the headers of hs that are not faultrouter.error.*
// or faultrouter.redrive.* headers: what an input carried of its own.
func WithoutContract(hs []kgo.RecordHeader) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	for _, h := range hs {
		if !strings.HasPrefix(h.Key, ErrorHeaderPrefix) && !strings.HasPrefix(h.Key, RedriveHeaderPrefix) {
			out = append(out, h)
		}
	}
	return out
}

// Carried returns the headers of an input that the router carries to every
// record routed from it: the trace context and the re-drive lineage.
func Carried(hs []kgo.RecordHeader) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	for _, h := range hs {
		if h.Key == HeaderTraceparent || strings.HasPrefix(h.Key, RedriveHeaderPrefix) {
			out = append(out, h)
		}
	}
	return out
}

// HeaderMap returns the contract headers of hs (faultrouter.error.* and
// faultrouter.redrive.*) as a map for printing, nil without any.
func HeaderMap(hs []kgo.RecordHeader) map[string]string {
	var m map[string]string
	for _, h := range hs {
		if strings.HasPrefix(h.Key, ErrorHeaderPrefix) || strings.HasPrefix(h.Key, RedriveHeaderPrefix) {
			if m == nil {
				m = map[string]string{}
			}
			m[h.Key] = string(h.Value)
		}
	}
	return m
}

// Truncate cuts s to at most n bytes on a UTF-8 boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// BreakerHeaders are the faultrouter.breaker.* headers of a record on the
// alerts or breakers topic.
type BreakerHeaders struct {
	// Instance is the writer of a breakers topic record (HeaderBreakerInstance).
	Instance string
	// AdoptedFrom is, on a TRANSITION, the instance whose change on the
	// breakers topic it was adopted from; empty for one the writer made.
	AdoptedFrom string
	// Latched is true on a TRANSITION that left the breaker latched OPEN;
	// LatchKnown tells that the header was there (records of releases
	// before it have none).
	Latched, LatchKnown bool
	// Alert is the HeaderAlert of an ALERT; empty on records of releases
	// before it.
	Alert string
	// ResetOffset is, on a RESET tombstone, the offset of the RESET it
	// removes (HeaderBreakerResetOffset); ResetNamed tells that it names one.
	ResetOffset int64
	ResetNamed  bool
	// AfterReset is, on a failure-rate state, the offset of the last RESET
	// its writer had applied (HeaderBreakerAfterReset, -1 for none);
	// AfterResetKnown tells that the header was there (records of releases
	// before it have none).
	AfterReset      int64
	AfterResetKnown bool
}

// ParseBreakerHeaders reads the faultrouter.breaker.* headers of a record.
func ParseBreakerHeaders(hs []kgo.RecordHeader) BreakerHeaders {
	var h BreakerHeaders
	for _, x := range hs {
		switch x.Key {
		case HeaderBreakerInstance:
			h.Instance = string(x.Value)
		case HeaderBreakerAdoptedFrom:
			h.AdoptedFrom = string(x.Value)
		case HeaderBreakerLatched:
			h.Latched, h.LatchKnown = string(x.Value) == "true", true
		case HeaderAlert:
			h.Alert = string(x.Value)
		case HeaderBreakerResetOffset:
			n, err := strconv.ParseInt(string(x.Value), 10, 64)
			h.ResetOffset, h.ResetNamed = n, err == nil
		case HeaderBreakerAfterReset:
			n, err := strconv.ParseInt(string(x.Value), 10, 64)
			h.AfterReset, h.AfterResetKnown = n, err == nil
		}
	}
	return h
}

// ParseForwardedFrom reads the faultrouter.forwarded.from header of a
// record: the topic, partition and offset of the record it is a forwarded
// copy of; ok false when it is none.
func ParseForwardedFrom(hs []kgo.RecordHeader) (topic string, partition int32, offset int64, ok bool) {
	for _, x := range hs {
		if x.Key != HeaderForwardedFrom {
			continue
		}
		v := string(x.Value)
		i := strings.LastIndexByte(v, '/')
		if i <= 0 {
			return "", 0, 0, false
		}
		j := strings.LastIndexByte(v[:i], '/')
		if j <= 0 {
			return "", 0, 0, false
		}
		p, err1 := strconv.ParseInt(v[j+1:i], 10, 32)
		o, err2 := strconv.ParseInt(v[i+1:], 10, 64)
		if err1 != nil || err2 != nil {
			return "", 0, 0, false
		}
		return v[:j], int32(p), o, true
	}
	return "", 0, 0, false
}
