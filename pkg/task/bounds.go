package task

import (
	"crypto/sha256"
	"encoding/base64"
	"maps"
	"slices"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Bounds of a task's state. The state travels as one record on the
// compacted changelog topic, so it must stay far below that topic's
// max.message.bytes whatever a task's events hold and however many there
// are: a state record the broker refuses would stop the task's partition.
// With these bounds a state record is under 256 KiB in the worst
// case (every string at its limit and made of characters JSON escapes to six
// bytes); a typical one is a few hundred bytes.
const (
	// MaxSeenEvents is the size of the dedup set: the latest event IDs of a
	// task. A redelivery of one of them is dropped; an event older than that
	// is taken as new (for a terminal task that is DUPLICATE_EXECUTION,
	// audit only).
	MaxSeenEvents = 256
	// MaxOperations bounds the business operations kept per task. Beyond
	// it the oldest resolved one is forgotten first; a WRITE whose outcome
	// is unknown is forgotten last.
	MaxOperations = 64
	// maxKeyBytes: an event or operation ID (or params hash) longer than
	// this, or with a byte outside [A-Za-z0-9._:/@+=#-], is kept as a
	// 22-character hash ("~" + base64url of 128 bits of its SHA-256).
	maxKeyBytes = 64
	// MaxTraceparentBytes: a longer traceparent header is not a W3C trace
	// context (55 bytes) and is not kept.
	MaxTraceparentBytes = 512
)

// Budgets of the bounded copy of the last event (State.LastEvent), in bytes
// of UTF-8. Identity fields (IDs, source, action, provider, model, prompt
// template, error type and code) are at most event.MaxIDBytes by validation
// and are kept whole, so that a retry published later names the same task,
// model and template.
const (
	maxCopyText       = 8 << 10 // output.text
	maxCopyMessage    = 4 << 10 // error.message
	maxCopyFlags      = 16      // output.flags, each at most maxCopyFlag
	maxCopyFlag       = 128
	maxCopyAttributes = 8 << 10 // attributes: keys and values, in key order
	maxCopyAttrValue  = 1 << 10
	maxCopyURI        = 2 << 10 // input_ref.uri
	maxCopyHash       = 128     // input_ref.sha256
)

// compactID returns id as the dedup set and the operation list keep it:
// itself when short and plain, a hash otherwise.
func compactID(id string) string {
	if len(id) <= maxKeyBytes && plain(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.' || c == '_' || c == ':' || c == '/' || c == '@' || c == '+' || c == '=' || c == '#' || c == '-':
		default:
			return false
		}
	}
	return true
}

// Seen reports whether the event ID is in the task's dedup set.
func (s *State) Seen(eventID string) bool {
	id := compactID(eventID)
	return slices.Contains(s.SeenEvents, id) || (id != eventID && slices.Contains(s.SeenEvents, eventID))
}

// MarkSeen adds the event ID to the dedup set, forgetting the oldest beyond
// MaxSeenEvents.
func (s *State) MarkSeen(eventID string) {
	if s.Seen(eventID) {
		return
	}
	s.SeenEvents = append(s.SeenEvents, compactID(eventID))
	if n := len(s.SeenEvents); n > MaxSeenEvents {
		s.SeenEvents = slices.Clone(s.SeenEvents[n-MaxSeenEvents:])
	}
}

// Op returns the operation with the given ID, or nil.
func (s *State) Op(opID string) *Operation {
	id := compactID(opID)
	for i := range s.Operations {
		if o := s.Operations[i].OpID; o == id || o == opID {
			return &s.Operations[i]
		}
	}
	return nil
}

// AddOperation records a new operation, forgetting one beyond MaxOperations:
// the oldest that is not a WRITE with an unknown outcome, else the oldest.
func (s *State) AddOperation(op Operation) {
	op.OpID, op.ParamsSHA256 = compactID(op.OpID), compactParams(op.ParamsSHA256)
	s.Operations = append(s.Operations, op)
	if len(s.Operations) <= MaxOperations {
		return
	}
	drop := 0
	for i, o := range s.Operations {
		if !o.Unknown() {
			drop = i
			break
		}
	}
	s.Operations = slices.Delete(s.Operations, drop, drop+1)
}

// SetParams records the approved params_sha256 of an operation that had none.
func (o *Operation) SetParams(sha string) { o.ParamsSHA256 = compactParams(sha) }

// SameParams reports whether sha is the operation's approved params_sha256
// (hex digits in either case).
func (o *Operation) SameParams(sha string) bool {
	return strings.EqualFold(o.ParamsSHA256, sha) || o.ParamsSHA256 == compactParams(sha)
}

func compactParams(sha string) string {
	if sha == "" {
		return ""
	}
	return compactID(sha)
}

// Unknown reports whether the operation is a WRITE whose outcome is unknown
// (SUBMITTED or UNKNOWN).
func (o *Operation) Unknown() bool {
	return o.Kind == event.OpWrite && (o.State == event.OpSubmitted || o.State == event.OpUnknown)
}

// SetTraceparent keeps the trace context of the latest input record, unless
// it is too long to be one.
func (s *State) SetTraceparent(tp string) {
	if tp != "" && len(tp) <= MaxTraceparentBytes {
		s.Traceparent = tp
	}
}

// SetLastEvent keeps a bounded copy of ev as the task's last event. Free
// text over its budget is cut; LastEventTruncated names the fields cut, so
// that a record built from the copy can say so. LastInput, where the whole
// event is, is cleared: the router sets it, the policy does not know it.
func (s *State) SetLastEvent(ev *event.TaskEvent) {
	s.LastEvent, s.LastEventTruncated = BoundedCopy(ev)
	s.LastInput = nil
}

// BoundedCopy returns a deep copy of ev whose free text fits the budgets
// above, and the JSON names of the fields it cut (nil when none).
func BoundedCopy(ev *event.TaskEvent) (*event.TaskEvent, []string) {
	// the copy and what it points to are one allocation (the attributes
	// map aside): a copy is made for every event decided
	m := &eventCopy{ev: *ev}
	c := &m.ev
	var cut []string
	bound := func(s string, n int, field string) string {
		if len(s) <= n {
			return s
		}
		cut = append(cut, field)
		return truncate(s, n)
	}
	if ev.Error != nil {
		m.err = *ev.Error
		e := &m.err
		if e.RetryAfterMs != nil {
			m.retryAfterMs = *e.RetryAfterMs
			e.RetryAfterMs = &m.retryAfterMs
		}
		e.Message = bound(e.Message, maxCopyMessage, "error.message")
		c.Error = e
	}
	if ev.Output != nil {
		m.out = *ev.Output
		o := &m.out
		if o.SchemaValid != nil {
			m.schemaValid = *o.SchemaValid
			o.SchemaValid = &m.schemaValid
		}
		if o.Confidence != nil {
			m.confidence = *o.Confidence
			o.Confidence = &m.confidence
		}
		o.Text = bound(o.Text, maxCopyText, "output.text")
		o.Flags = nil
		for i, f := range ev.Output.Flags {
			if i == maxCopyFlags {
				cut = append(cut, "output.flags")
				break
			}
			o.Flags = append(o.Flags, bound(f, maxCopyFlag, "output.flags"))
		}
		c.Output = o
	}
	if ev.Operation != nil {
		m.op = *ev.Operation
		c.Operation = &m.op
	}
	if ev.InputRef != nil {
		m.ref = *ev.InputRef
		ir := &m.ref
		ir.URI = bound(ir.URI, maxCopyURI, "input_ref.uri")
		ir.SHA256 = bound(ir.SHA256, maxCopyHash, "input_ref.sha256")
		c.InputRef = ir
	}
	if ev.SLAMs != nil {
		m.slaMs = *ev.SLAMs
		c.SLAMs = &m.slaMs
	}
	c.Attributes = nil
	switch {
	case len(ev.Attributes) == 0:
	case attributesFit(ev.Attributes): // nothing to cut: no need to choose what to keep in key order
		c.Attributes = maps.Clone(ev.Attributes)
	default:
		c.Attributes = make(map[string]string, len(ev.Attributes))
		left := maxCopyAttributes
		for _, k := range slices.Sorted(maps.Keys(ev.Attributes)) {
			v := bound(ev.Attributes[k], maxCopyAttrValue, "attributes")
			if len(k)+len(v) > left {
				cut = append(cut, "attributes")
				break
			}
			c.Attributes[k] = v
			left -= len(k) + len(v)
		}
	}
	return c, slices.Compact(cut)
}

// eventCopy is a TaskEvent with room for what its pointers point to.
type eventCopy struct {
	ev           event.TaskEvent
	err          event.Error
	out          event.Output
	op           event.Operation
	ref          event.InputRef
	slaMs        int64
	retryAfterMs int64
	confidence   float64
	schemaValid  bool
}

// attributesFit reports whether BoundedCopy keeps the attributes whole.
func attributesFit(attrs map[string]string) bool {
	left := maxCopyAttributes
	for k, v := range attrs {
		if len(v) > maxCopyAttrValue || len(k)+len(v) > left {
			return false
		}
		left -= len(k) + len(v)
	}
	return true
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// Shrink cuts the state to what routing needs, for a state record that
// would not fit its topic despite the bounds: the copy of the last event
// loses its free text and attributes, the dedup set keeps its latest 16 IDs.
func (s *State) Shrink() {
	if ev := s.LastEvent; ev != nil {
		c := *ev
		c.Output, c.Attributes, c.InputRef = nil, nil, nil
		if ev.Error != nil {
			e := *ev.Error
			e.Message = ""
			c.Error = &e
		}
		s.LastEvent = &c
		s.LastEventTruncated = []string{"output", "error.message", "input_ref", "attributes"}
	}
	if n := len(s.SeenEvents); n > 16 {
		s.SeenEvents = slices.Clone(s.SeenEvents[n-16:])
	}
}
