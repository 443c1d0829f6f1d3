package codec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"time"
	"unsafe"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// The router decodes every input TaskEvent, so the current TaskEvent schema
// is read and written here directly into and from Go values, without
// goavro's generic maps (which cost a dozen allocations per record and most
// of the decode time). goavro stays the authority: the reader follows its
// rules byte for byte (varints, unions, blocks, MaxBlockCount), New checks
// both directions against goavro on full samples and falls back to goavro if
// they differ (a schema edit this file does not know), a record this reader
// rejects is decoded again by goavro for the error, and
// TestEventWireMatchesGoavro and FuzzEventWire compare the two.

// eventWire reads and writes bodies of one TaskEvent schema.
type eventWire struct {
	stage, status, opKind, opState []string
	stageIdx, statusIdx            map[string]int64
	opKindIdx, opStateIdx          map[string]int64
}

func newEventWire(schemaJSON string) (*eventWire, error) {
	var root any
	if err := json.Unmarshal([]byte(schemaJSON), &root); err != nil {
		return nil, err
	}
	enums := map[string][]string{}
	collectEnums(root, enums)
	w := &eventWire{stage: enums["Stage"], status: enums["Status"], opKind: enums["OpKind"], opState: enums["OpState"]}
	if len(w.stage) == 0 || len(w.status) == 0 || len(w.opKind) == 0 || len(w.opState) == 0 {
		return nil, errors.New("codec: TaskEvent schema lacks an enum")
	}
	idx := func(syms []string) map[string]int64 {
		m := make(map[string]int64, len(syms))
		for i, s := range syms {
			m[s] = int64(i)
		}
		return m
	}
	w.stageIdx, w.statusIdx, w.opKindIdx, w.opStateIdx = idx(w.stage), idx(w.status), idx(w.opKind), idx(w.opState)
	return w, nil
}

// rd reads Avro binary values with goavro's rules, keeping the first error.
// With view set, the strings it reads share the bytes read (no copy).
type rd struct {
	b    []byte
	err  error
	view bool
}

func (r *rd) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// long is goavro's longNativeFromBinary.
func (r *rd) long() int64 {
	var v uint64
	var shift uint
	for i := 0; i < len(r.b); i++ {
		c := r.b[i]
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			r.b = r.b[i+1:]
			return int64(v>>1) ^ -int64(v&1)
		}
		shift += 7
	}
	r.fail(io.ErrShortBuffer)
	return 0
}

// int is goavro's intNativeFromBinary: the same zig-zag varint as long,
// truncated to 32 bits.
func (r *rd) int() int32 { return int32(r.long()) }

func (r *rd) str() string {
	if len(r.b) < 1 {
		r.fail(io.ErrShortBuffer)
		return ""
	}
	n := r.long()
	if r.err != nil {
		return ""
	}
	if n < 0 || n > int64(len(r.b)) {
		r.fail(fmt.Errorf("string size %d", n))
		return ""
	}
	var s string
	if r.view && n > 0 {
		s = unsafe.String(&r.b[0], n)
	} else {
		s = string(r.b[:n])
	}
	r.b = r.b[n:]
	return s
}

func (r *rd) double() float64 {
	if len(r.b) < 8 {
		r.fail(io.ErrShortBuffer)
		return 0
	}
	f := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	return f
}

func (r *rd) boolean() bool {
	if len(r.b) < 1 {
		r.fail(io.ErrShortBuffer)
		return false
	}
	c := r.b[0]
	r.b = r.b[1:]
	if c > 1 {
		r.fail(fmt.Errorf("boolean byte %d", c))
	}
	return c == 1
}

// branch reads the index of a union of n branches.
func (r *rd) branch(n int64) int64 {
	i := r.long()
	if r.err == nil && (i < 0 || i >= n) {
		r.fail(fmt.Errorf("union index %d", i))
	}
	return i
}

func (r *rd) enum(syms []string) string {
	i := r.long()
	if r.err != nil {
		return ""
	}
	if i < 0 || i >= int64(len(syms)) {
		r.fail(fmt.Errorf("enum index %d", i))
		return ""
	}
	return syms[i]
}

func (r *rd) optStr() string {
	if r.branch(2) == 1 {
		return r.str()
	}
	return ""
}

// blocks reads the item counts of an array or map, calling item for each.
func (r *rd) blocks(item func()) {
	for r.err == nil {
		n := r.long()
		if r.err != nil || n == 0 {
			return
		}
		if n < 0 {
			if n == math.MinInt64 {
				r.fail(fmt.Errorf("block count %d", n))
				return
			}
			n = -n
			r.long() // block size in bytes, unused
		}
		if n > int64(maxBlockCount) {
			r.fail(fmt.Errorf("block count %d over %d", n, maxBlockCount))
			return
		}
		for i := int64(0); i < n && r.err == nil; i++ {
			item()
		}
	}
}

// millis is the time goavro's timestamp-millis decoder gives for ms, in ms.
func millis(ms int64) int64 {
	s := ms / 1e3
	return time.Unix(s, (ms-s*1e3)*1e6).UnixMilli()
}

// decode reads a TaskEvent body into e, mapping it as taskEventFrom maps
// goavro's values; d collects what nat would report.
func (w *eventWire) decode(r *rd, d *nat, e *event.TaskEvent) {
	e.EventID = r.str()
	e.TaskID = r.str()
	e.Attempt = r.int()
	e.OccurredAt = d.millisTS("occurred_at", millis(r.long()))
	e.Source = r.str()
	e.Action = r.str()
	e.Provider = r.optStr()
	e.Model = r.optStr()
	e.PromptTemplate = r.optStr()
	if r.branch(2) == 1 {
		e.Stage = event.Stage(r.enum(w.stage))
	}
	e.Status = event.Status(r.enum(w.status))
	if r.branch(2) == 1 {
		x := &event.Error{}
		x.Type = r.optStr()
		if r.branch(2) == 1 {
			x.HTTPStatus = r.int()
		}
		x.Code = r.optStr()
		x.Message = r.optStr()
		if r.branch(2) == 1 {
			v := r.long()
			x.RetryAfterMs = &v
		}
		e.Error = x
	}
	if r.branch(2) == 1 {
		o := &event.Output{}
		o.Text = r.optStr()
		if r.branch(2) == 1 {
			v := r.boolean()
			o.SchemaValid = &v
		}
		if r.branch(2) == 1 {
			v := r.double()
			o.Confidence = &v
		}
		r.blocks(func() { o.Flags = append(o.Flags, r.str()) })
		e.Output = o
	}
	e.Usage.CostUSD = r.double()
	e.Usage.Tokens = r.long()
	e.Usage.ElapsedMs = r.long()
	if r.branch(2) == 1 {
		op := &event.Operation{}
		op.OpID = r.str()
		op.Kind = event.OpKind(r.enum(w.opKind))
		op.ParamsSHA256 = r.optStr()
		op.State = event.OpState(r.enum(w.opState))
		e.Operation = op
	}
	if r.branch(2) == 1 {
		ref := &event.InputRef{}
		ref.URI = r.str()
		ref.SHA256 = r.optStr()
		if r.branch(2) == 1 {
			ref.SizeBytes = r.long()
		}
		e.InputRef = ref
	}
	if r.branch(2) == 1 {
		v := r.long()
		e.SLAMs = &v
	}
	r.blocks(func() {
		k := r.str()
		v := r.str()
		if r.err == nil {
			if e.Attributes == nil {
				e.Attributes = map[string]string{}
			}
			e.Attributes[k] = v
		}
	})
}

// encode appends the body of e. It fails only on an enum value the schema
// does not have.
func (w *eventWire) encode(dst []byte, e *event.TaskEvent) ([]byte, error) {
	dst = appendString(dst, e.EventID)
	dst = appendString(dst, e.TaskID)
	dst = binary.AppendVarint(dst, int64(e.Attempt))
	dst = binary.AppendVarint(dst, e.OccurredAt.Millis())
	dst = appendString(dst, e.Source)
	dst = appendString(dst, e.Action)
	dst = appendOptString(dst, e.Provider)
	dst = appendOptString(dst, e.Model)
	dst = appendOptString(dst, e.PromptTemplate)
	if e.Stage == "" {
		dst = append(dst, 0)
	} else {
		i, ok := w.stageIdx[string(e.Stage)]
		if !ok {
			return dst, fmt.Errorf("codec: encode %s: stage: %q is not a symbol of the schema", "faultrouter.TaskEvent", e.Stage)
		}
		dst = binary.AppendVarint(append(dst, 2), i)
	}
	i, ok := w.statusIdx[string(e.Status)]
	if !ok {
		return dst, fmt.Errorf("codec: encode %s: status: %q is not a symbol of the schema", "faultrouter.TaskEvent", e.Status)
	}
	dst = binary.AppendVarint(dst, i)
	if x := e.Error; x != nil {
		dst = append(dst, 2)
		dst = appendOptString(dst, x.Type)
		if x.HTTPStatus != 0 {
			dst = binary.AppendVarint(append(dst, 2), int64(x.HTTPStatus))
		} else {
			dst = append(dst, 0)
		}
		dst = appendOptString(dst, x.Code)
		dst = appendOptString(dst, x.Message)
		dst = appendOptLong(dst, x.RetryAfterMs)
	} else {
		dst = append(dst, 0)
	}
	if o := e.Output; o != nil {
		dst = append(dst, 2)
		dst = appendOptString(dst, o.Text)
		if o.SchemaValid != nil {
			b := byte(0)
			if *o.SchemaValid {
				b = 1
			}
			dst = append(dst, 2, b)
		} else {
			dst = append(dst, 0)
		}
		if o.Confidence != nil {
			dst = binary.LittleEndian.AppendUint64(append(dst, 2), math.Float64bits(*o.Confidence))
		} else {
			dst = append(dst, 0)
		}
		if len(o.Flags) > 0 {
			dst = binary.AppendVarint(dst, int64(len(o.Flags)))
			for _, f := range o.Flags {
				dst = appendString(dst, f)
			}
		}
		dst = append(dst, 0)
	} else {
		dst = append(dst, 0)
	}
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(e.Usage.CostUSD))
	dst = binary.AppendVarint(dst, e.Usage.Tokens)
	dst = binary.AppendVarint(dst, e.Usage.ElapsedMs)
	if op := e.Operation; op != nil {
		dst = appendString(append(dst, 2), op.OpID)
		k, ok := w.opKindIdx[string(op.Kind)]
		if !ok {
			return dst, fmt.Errorf("codec: encode %s: operation.kind: %q is not a symbol of the schema", "faultrouter.TaskEvent", op.Kind)
		}
		dst = binary.AppendVarint(dst, k)
		dst = appendOptString(dst, op.ParamsSHA256)
		s, ok := w.opStateIdx[string(op.State)]
		if !ok {
			return dst, fmt.Errorf("codec: encode %s: operation.state: %q is not a symbol of the schema", "faultrouter.TaskEvent", op.State)
		}
		dst = binary.AppendVarint(dst, s)
	} else {
		dst = append(dst, 0)
	}
	if ref := e.InputRef; ref != nil {
		dst = appendString(append(dst, 2), ref.URI)
		dst = appendOptString(dst, ref.SHA256)
		if ref.SizeBytes != 0 {
			dst = binary.AppendVarint(append(dst, 2), ref.SizeBytes)
		} else {
			dst = append(dst, 0)
		}
	} else {
		dst = append(dst, 0)
	}
	dst = appendOptLong(dst, e.SLAMs)
	if len(e.Attributes) > 0 {
		dst = binary.AppendVarint(dst, int64(len(e.Attributes)))
		for k, v := range e.Attributes {
			dst = appendString(dst, k)
			dst = appendString(dst, v)
		}
	}
	return append(dst, 0), nil
}

func appendOptLong(dst []byte, p *int64) []byte {
	if p == nil {
		return append(dst, 0)
	}
	return binary.AppendVarint(append(dst, 2), *p)
}

// eventWireAgrees checks this reader and writer against goavro on samples
// that set every field and leave every optional one out.
func (c *Codec) eventWireAgrees(w *writer, ew *eventWire) bool {
	for _, r := range routedSamples() {
		if r.Event == nil {
			continue
		}
		for _, e := range []event.TaskEvent{*r.Event, {EventID: "e", TaskID: "t", Attempt: 1, Status: event.StatusOK}} {
			e.Attributes = map[string]string{"k": "v"} // one entry: goavro's map order is random
			n := teNatives.Get().(*teNative)
			want, err := w.codec.BinaryFromNative(nil, n.fill(&e))
			n.release()
			if err != nil {
				return false
			}
			got, err := ew.encode(nil, &e)
			if err != nil || string(got) != string(want) {
				return false
			}
			d := nat{v: c.view}
			var back event.TaskEvent
			r := rd{b: got}
			ew.decode(&r, &d, &back)
			if r.err != nil || d.err != nil || len(r.b) != 0 || !reflect.DeepEqual(back, e) {
				return false
			}
		}
	}
	return true
}
