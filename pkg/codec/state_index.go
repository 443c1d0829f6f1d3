package codec

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// StateIndex is the part of a task state that names its entries in the
// store's indexes: the due index of a pending retry, the expiry index and
// the overdue-review index. A restore that rebuilds those entries from the
// changelog needs only these fields, which DecodeStateIndex reads without
// building the whole task.State.
type StateIndex struct {
	// TaskID shares the bytes decoded when they are a record of the current
	// TaskState schema (see DecodeStateView); it is copied otherwise.
	TaskID string
	// Pending is true when the state holds a retry decided but not yet due,
	// Retry being that retry (zero when Pending is false).
	Pending bool
	Retry   task.PendingRetry
	// ExpiresAt is the router-clock time (ms) the state expires; 0 for never.
	ExpiresAt int64
	// Review is one of the task.Review* constants when it is one (so it does
	// not hold on to the bytes decoded), else a string like TaskID.
	Review        string
	ReviewDueAt   int64
	ReviewAlerted bool
}

// DecodeStateIndex reads the index fields of a task state written by
// EncodeState, or of any form DecodeState reads (the JSON of earlier
// builds, older TaskState versions), into x. It accepts and rejects exactly
// what DecodeState does, and the fields it sets equal those of the state
// DecodeState returns; on an error x is zero.
//
// A record of the current TaskState schema is walked once without building
// anything: strings and the embedded last_event are skipped, but checked as
// the full decode checks them (string lengths, union and enum indexes,
// boolean bytes, block counts, occurred_at's range, no trailing bytes), so
// it does not allocate. A record the walk rejects, and every other form,
// goes through DecodeStateView, whose result (or error) is the answer.
func (c *Codec) DecodeStateIndex(b []byte, x *StateIndex) error {
	*x = StateIndex{}
	if c.stateWalk && c.ofCurrentState(b) {
		if c.walkStateIndex(b[headerLen:], x) {
			return nil
		}
		*x = StateIndex{}
	}
	st, err := c.decodeState(b, true)
	if err != nil {
		return err
	}
	x.TaskID = st.TaskID
	if st.Pending != nil {
		x.Pending, x.Retry = true, *st.Pending
	}
	x.ExpiresAt = st.ExpiresAt
	x.Review = reviewConst(st.Review)
	x.ReviewDueAt = st.ReviewDueAt
	x.ReviewAlerted = st.ReviewAlerted
	return nil
}

// stateWalkAgrees checks the walk against readState on samples with every
// part of a state set and with the optional ones left out: a schema edit
// the walk does not know turns it off rather than making it misread.
func (c *Codec) stateWalkAgrees() bool {
	bare := sampleState()
	bare.Review, bare.Pending, bare.LastEvent, bare.LastInput = "OTHER", nil, nil, nil
	short := sampleState()
	short.LastEvent = &event.TaskEvent{EventID: "e", TaskID: "t", Attempt: 1, Status: event.StatusOK}
	for _, st := range []*task.State{sampleState(), bare, short, {TaskID: "t"}} {
		b, err := c.appendState(header(nil, c.state), st)
		if err != nil {
			return false
		}
		var x StateIndex
		if !c.walkStateIndex(b[headerLen:], &x) {
			return false
		}
		want := StateIndex{TaskID: st.TaskID, ExpiresAt: st.ExpiresAt, Review: st.Review,
			ReviewDueAt: st.ReviewDueAt, ReviewAlerted: st.ReviewAlerted}
		if st.Pending != nil {
			want.Pending, want.Retry = true, *st.Pending
		}
		if x != want {
			return false
		}
		// one byte more or less is not a state
		if c.walkStateIndex(b[headerLen:len(b)-1], &x) || c.walkStateIndex(append(b[headerLen:], 0), &x) {
			return false
		}
	}
	return true
}

// ofCurrentState reports whether b has the header of the current TaskState
// schema: the fingerprint this build writes or another of the same schema
// (writerOf would return c.state).
func (c *Codec) ofCurrentState(b []byte) bool {
	if len(b) < headerLen || b[0] != 0xC3 || b[1] != 0x01 {
		return false
	}
	fp := binary.LittleEndian.Uint64(b[2:headerLen])
	return fp == c.state.fp || c.writers[fp] == c.state
}

// reviewConst returns the task.Review* constant equal to s, or s.
func reviewConst(s string) string {
	switch s {
	case task.ReviewNone:
		return task.ReviewNone
	case task.ReviewOpen:
		return task.ReviewOpen
	case task.ReviewApproved:
		return task.ReviewApproved
	case task.ReviewRejected:
		return task.ReviewRejected
	case task.ReviewResolved:
		return task.ReviewResolved
	}
	return s
}

// walkStateIndex walks a body of the current TaskState schema as readState
// reads it, keeping only the index fields. It reports whether readState
// would accept the body: every check of rd (string lengths, union and enum
// indexes, boolean bytes, block counts) passes, nothing trails, and
// last_event's occurred_at passes nat's range check.
//
// The walk threads the read position i through functions of (b, i) that
// return the next position, or -1 once a check failed (every function
// fails again on -1, so the walk needs no early exits): the position stays
// in a register rather than in memory.
func (c *Codec) walkStateIndex(b []byte, x *StateIndex) bool {
	var n int64
	i := 0
	x.TaskID, i = walkStr(b, i)
	i = skipStrs(b, i)   // seen
	i = skipVarint(b, i) // attempts
	i = skipVarint(b, i) // retries
	// retries_by_class
	for n, i = walkBlock(b, i); n > 0; n, i = walkBlock(b, i) {
		for ; n > 0; n-- {
			i = skipVarint(b, skipStr(b, i))
		}
	}
	// rate_limited_at
	for n, i = walkBlock(b, i); n > 0; n, i = walkBlock(b, i) {
		for ; n > 0; n-- {
			i = skipVarint(b, i)
		}
	}
	i = skipBytes(b, i, 8) // cost_usd
	i = skipVarint(b, i)   // tokens
	i = skipVarint(b, i)   // elapsed_ms
	// operations
	for n, i = walkBlock(b, i); n > 0; n, i = walkBlock(b, i) {
		for ; n > 0; n-- {
			i = skipStr(b, i)    // op_id
			i = skipStr(b, i)    // kind
			i = skipOptStr(b, i) // params_sha256
			i = skipStr(b, i)    // state
		}
	}
	var review string
	review, i = walkStr(b, i)
	x.Review = reviewConst(review)
	i = skipStr(b, i) // review_class
	i = skipStr(b, i) // review_owner
	x.ReviewDueAt, i = walkVarint(b, i)
	x.ReviewAlerted, i = walkBoolean(b, i)
	_, i = walkBoolean(b, i) // terminal
	i = skipStr(b, i)        // terminal_class
	i = skipStr(b, i)        // last_class
	i = skipStr(b, i)        // last_route
	i = skipVarint(b, i)     // first_event_at
	i = skipVarint(b, i)     // last_event_at
	i = skipVarint(b, i)     // last_seen_at
	i = skipVarint(b, i)     // sla_ms
	x.ExpiresAt, i = walkVarint(b, i)
	if x.Pending, i = walkPresent(b, i); x.Pending {
		var v int64
		v, i = walkVarint(b, i)
		x.Retry.N = int32(v)
		x.Retry.DelayMs, i = walkVarint(b, i)
		x.Retry.NotBefore, i = walkVarint(b, i)
		x.Retry.DueAt, i = walkVarint(b, i)
	}
	i = skipStr(b, i) // traceparent
	var ok bool
	if ok, i = walkPresent(b, i); ok {
		i = c.event.walk(b, i)
	}
	i = skipStrs(b, i) // last_event_truncated
	// last_input
	if ok, i = walkPresent(b, i); ok {
		i = skipStr(b, i)    // topic
		i = skipVarint(b, i) // partition
		i = skipVarint(b, i) // offset
		i = skipVarint(b, i) // timestamp
	}
	return i == len(b)
}

// walk passes over a TaskEvent body at b[i:] with decode's checks, without
// building the event, occurred_at passing nat.millisTS's range check. It
// returns the position after the body, or -1.
func (ew *eventWire) walk(b []byte, i int) int {
	var ok bool
	var n int64
	i = skipStr(b, i)    // event_id
	i = skipStr(b, i)    // task_id
	i = skipVarint(b, i) // attempt
	n, i = walkVarint(b, i)
	if ms := millis(n); ms != 0 && (ms < minMillis || ms > maxMillis) {
		return -1
	}
	i = skipStr(b, i)    // source
	i = skipStr(b, i)    // action
	i = skipOptStr(b, i) // provider
	i = skipOptStr(b, i) // model
	i = skipOptStr(b, i) // prompt_template
	if ok, i = walkPresent(b, i); ok {
		i = walkEnum(b, i, len(ew.stage))
	}
	i = walkEnum(b, i, len(ew.status))
	// error
	if ok, i = walkPresent(b, i); ok {
		i = skipOptStr(b, i) // type
		if ok, i = walkPresent(b, i); ok {
			i = skipVarint(b, i) // http_status
		}
		i = skipOptStr(b, i) // code
		i = skipOptStr(b, i) // message
		if ok, i = walkPresent(b, i); ok {
			i = skipVarint(b, i) // retry_after_ms
		}
	}
	// output
	if ok, i = walkPresent(b, i); ok {
		i = skipOptStr(b, i) // text
		if ok, i = walkPresent(b, i); ok {
			_, i = walkBoolean(b, i) // schema_valid
		}
		if ok, i = walkPresent(b, i); ok {
			i = skipBytes(b, i, 8) // confidence
		}
		i = skipStrs(b, i) // flags
	}
	i = skipBytes(b, i, 8) // usage.cost_usd
	i = skipVarint(b, i)   // usage.tokens
	i = skipVarint(b, i)   // usage.elapsed_ms
	// operation
	if ok, i = walkPresent(b, i); ok {
		i = skipStr(b, i) // op_id
		i = walkEnum(b, i, len(ew.opKind))
		i = skipOptStr(b, i) // params_sha256
		i = walkEnum(b, i, len(ew.opState))
	}
	// input_ref
	if ok, i = walkPresent(b, i); ok {
		i = skipStr(b, i)    // uri
		i = skipOptStr(b, i) // sha256
		if ok, i = walkPresent(b, i); ok {
			i = skipVarint(b, i) // size_bytes
		}
	}
	if ok, i = walkPresent(b, i); ok {
		i = skipVarint(b, i) // sla_ms
	}
	// attributes
	for n, i = walkBlock(b, i); n > 0; n, i = walkBlock(b, i) {
		for ; n > 0; n-- {
			i = skipStr(b, skipStr(b, i))
		}
	}
	return i
}

// The walk's readers. Each reads the value at b[i:] with rd's rules and
// checks and returns the position after it, or -1 when a check fails or i
// is already -1. The common cases (a one-byte varint, a short string, a
// union index) are read first; the rest as rd reads it.

// walkVarint is rd.long.
func walkVarint(b []byte, i int) (int64, int) {
	var v uint64
	var shift uint
	for ; uint(i) < uint(len(b)); i++ {
		c := b[i]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int64(v>>1) ^ -int64(v&1), i + 1
		}
		shift += 7
	}
	return 0, -1
}

// skipVarint passes over a long whose value is not needed: rd.long fails
// only when the bytes end before the varint does.
func skipVarint(b []byte, i int) int {
	for ; uint(i) < uint(len(b)); i++ {
		if b[i] < 0x80 {
			return i + 1
		}
	}
	return -1
}

// skipBytes passes over n bytes (a double is 8).
func skipBytes(b []byte, i, n int) int {
	if i < 0 || n > len(b)-i {
		return -1
	}
	return i + n
}

// skipStr passes over a string with rd.str's checks.
func skipStr(b []byte, i int) int {
	var v uint64
	var shift uint
	for ; uint(i) < uint(len(b)); i++ {
		v |= uint64(b[i]&0x7f) << shift
		if b[i] < 0x80 {
			// v is the zig-zag length: odd is negative
			if v&1 != 0 || v>>1 > uint64(len(b)-i-1) {
				return -1
			}
			return i + 1 + int(v>>1)
		}
		shift += 7
	}
	return -1
}

// walkStr is rd.str of a view: the string shares b.
func walkStr(b []byte, i int) (string, int) {
	n, i := walkVarint(b, i)
	if i < 0 || n < 0 || n > int64(len(b)-i) {
		return "", -1
	}
	if n == 0 {
		return "", i
	}
	return unsafe.String(&b[i], n), i + int(n)
}

func walkBoolean(b []byte, i int) (bool, int) {
	if uint(i) < uint(len(b)) && b[i] <= 1 {
		return b[i] == 1, i + 1
	}
	return false, -1
}

// walkPresent reads the index of a ["null", T] union: true for T.
func walkPresent(b []byte, i int) (bool, int) {
	v, i := walkVarint(b, i)
	if uint64(v) > 1 {
		return false, -1
	}
	return v == 1, i
}

// walkEnum reads the index of an enum of n symbols.
func walkEnum(b []byte, i, n int) int {
	v, i := walkVarint(b, i)
	if v < 0 || v >= int64(n) {
		return -1
	}
	return i
}

func skipOptStr(b []byte, i int) int {
	ok, i := walkPresent(b, i)
	if ok {
		return skipStr(b, i)
	}
	return i
}

// skipStrs passes over an array of strings.
func skipStrs(b []byte, i int) int {
	var n int64
	for n, i = walkBlock(b, i); n > 0; n, i = walkBlock(b, i) {
		for ; n > 0; n-- {
			i = skipStr(b, i)
		}
	}
	return i
}

// walkBlock reads the item count of the next block of an array or map with
// rd.blocks' checks: 0 at the end of the items or after a failure.
func walkBlock(b []byte, i int) (int64, int) {
	if uint(i) < uint(len(b)) && b[i]&0x81 == 0 { // 0 to 63 items
		return int64(b[i] >> 1), i + 1
	}
	n, i := walkVarint(b, i)
	if i < 0 {
		return 0, -1
	}
	if n < 0 {
		if n == math.MinInt64 {
			return 0, -1
		}
		n = -n
		if i = skipVarint(b, i); i < 0 { // block size in bytes, unused
			return 0, -1
		}
	}
	if n > maxBlockCount {
		return 0, -1
	}
	return n, i
}
