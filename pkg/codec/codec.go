// Package codec reads and writes faultrouter's records in the Avro
// single-object encoding: the marker 0xC3 0x01, the 8-byte little-endian
// CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form (as
// the Avro specification defines both, computed by package avro), and the
// Avro binary body. Java's BinaryMessageEncoder and fastavro write the same
// header for the same schema.
//
// A record is decoded with the writer schema its fingerprint names, out of an
// explicit accepted set (avro.All), and then mapped onto the reader's fields:
// a field the reader does not have is ignored, a field the writer did not
// have takes its default, an enum symbol the reader does not know takes the
// reader's enum default. Decoding never panics; every error wraps one of the
// sentinels of errors.go.
package codec

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/linkedin/goavro/v2"
)

// maxBlockCount bounds the item count of one Avro array or map block. goavro
// preallocates a block's items, so without a bound a 20-byte record could ask
// for gigabytes. No faultrouter record has anywhere near this many flags or
// attributes.
const maxBlockCount = 1 << 14

func init() {
	// goavro's bound is a package variable; faultrouter reads Avro only
	// through this package, so it is set once, before any decode.
	if goavro.MaxBlockCount > maxBlockCount {
		goavro.MaxBlockCount = maxBlockCount
	}
}

const headerLen = 10 // marker (2) + fingerprint (8)

// SchemaInfo describes one accepted writer schema.
type SchemaInfo struct {
	// Name is the record's full name, e.g. faultrouter.TaskEvent.
	Name string
	// Version is the schema version, see avro/README.md.
	Version int
	// Fingerprint is the CRC-64-AVRO fingerprint of the Parsing Canonical
	// Form, as the Avro specification defines it, as 16 hex digits (the
	// uint64 value, most significant digit first; the wire carries it
	// little-endian). It is the fingerprint this codec writes.
	Fingerprint string
	// Legacy is the fingerprint builds before the specification's
	// fingerprints wrote for the same schema, accepted on read only; "" if
	// none.
	Legacy string
	// Writes is true for the version this codec writes.
	Writes bool
}

// Options configure a Codec built with NewWith.
type Options struct {
	// TaskEventVersion is the TaskEvent schema version this codec writes and
	// reads into, i.e. the version the program using it was built for.
	// Records written with any accepted version are read; fields the
	// version does not have are dropped. Default 0: the current version.
	TaskEventVersion int
	// CurrentRoutedOnly writes every RoutedRecord with the current version,
	// also a decision no policy override made (written with version 2 by
	// default, for readers of an earlier build). For the Confluent wire
	// format, whose readers resolve the writer schema by its registry ID and
	// whose subjects hold the current version only.
	CurrentRoutedOnly bool
}

// Codec encodes and decodes faultrouter's records. It is safe for concurrent use.
type Codec struct {
	writers  map[uint64]*writer // accepted writer schemas by fingerprint
	accepted []SchemaInfo

	taskEvent, routed, breaker, review, state *writer // the schemas this codec writes
	// routedPlain is RoutedRecord version 2, written for a decision no
	// policy override made (decision.override null), so that a reader
	// that knows only version 2 reads every record of a policy without
	// overrides; nil if this build cannot write it
	routedPlain *writer

	view *view // the reader's fields and enums

	// wire writes RoutedRecords without goavro (routed_wire.go); nil when
	// it does not agree with goavro on this build's schemas; wirePlain is
	// the same for routedPlain
	wire, wirePlain *routedWire
	// event reads and writes bodies of the current TaskEvent schema without
	// goavro (event_wire.go); nil when it does not agree with goavro
	event *eventWire
	// stateWire is set when state.go's TaskState reader and writer agree
	// with goavro
	stateWire bool
	// stateWalk is set when state_index.go's walk of a TaskState agrees
	// with the reader of stateWire
	stateWalk bool
	// schemas finds the writer schemas of records in the Confluent wire
	// format (confluent.go); nil: such records do not decode
	schemas SchemaSource
}

// writer is one accepted writer schema.
type writer struct {
	name    string
	version int
	fp      uint64
	codec   *goavro.Codec
	json    string // the composed schema text
}

// New returns a Codec that writes the current schemas and accepts every
// schema version listed in avro.All.
func New() (*Codec, error) { return NewWith(Options{}) }

// NewWith returns a Codec configured by o.
func NewWith(o Options) (*Codec, error) {
	all, err := avro.All()
	if err != nil {
		return nil, err
	}
	teVersion := o.TaskEventVersion
	if teVersion == 0 {
		cur, err := avro.Current(avro.TaskEvent)
		if err != nil {
			return nil, err
		}
		teVersion = cur.Version
	}
	c := &Codec{writers: make(map[uint64]*writer, 2*len(all))}
	var readers []string
	for _, s := range all {
		gc, err := goavro.NewCodec(s.JSON)
		if err != nil {
			return nil, fmt.Errorf("codec: schema %s v%d (%s): %w", s.Name, s.Version, s.File, err)
		}
		w := &writer{name: s.Name, version: s.Version, fp: s.Fingerprint, codec: gc, json: s.JSON}
		legacy := ""
		for _, fp := range []uint64{s.Fingerprint, s.Legacy} {
			if fp == 0 {
				continue
			}
			if prev, dup := c.writers[fp]; dup {
				return nil, fmt.Errorf("codec: %s v%d has the fingerprint %016x of %s v%d", s.Name, s.Version, fp, prev.name, prev.version)
			}
			c.writers[fp] = w
		}
		if s.Legacy != 0 {
			legacy = fmt.Sprintf("%016x", s.Legacy)
		}
		writes := false
		switch {
		case s.Name == avro.TaskEvent && s.Version == teVersion:
			c.taskEvent, writes = w, true
			readers = append([]string{s.JSON}, readers...) // TaskEvent's enums first
		case s.Name == avro.RoutedRecord && s.Current:
			c.routed, writes = w, true
			readers = append(readers, s.JSON)
		case s.Name == avro.RoutedRecord && s.Version == plainRoutedVersion && !o.CurrentRoutedOnly:
			c.routedPlain, writes = w, true
		case s.Name == avro.BreakerEvent && s.Current:
			c.breaker, writes = w, true
			readers = append(readers, s.JSON)
		case s.Name == avro.ReviewDecision && s.Current:
			c.review, writes = w, true
			readers = append(readers, s.JSON)
		case s.Name == avro.TaskState && s.Current:
			c.state, writes = w, true
		}
		c.accepted = append(c.accepted, SchemaInfo{
			Name: s.Name, Version: s.Version, Fingerprint: fmt.Sprintf("%016x", w.fp), Legacy: legacy, Writes: writes,
		})
	}
	if c.taskEvent == nil {
		return nil, fmt.Errorf("codec: TaskEventVersion %d is not a known TaskEvent schema version", o.TaskEventVersion)
	}
	if c.routed == nil || c.breaker == nil || c.review == nil || c.state == nil {
		return nil, fmt.Errorf("codec: a current schema is missing from the avro catalog")
	}
	if c.view, err = newView(readers); err != nil {
		return nil, err
	}
	cur, err := avro.Current(avro.TaskEvent)
	if err != nil {
		return nil, err
	}
	routed, err := avro.Current(avro.RoutedRecord)
	if err != nil {
		return nil, err
	}
	if c.wire, err = newRoutedWire(routed.JSON, c.writers[cur.Fingerprint]); err != nil {
		return nil, err
	}
	if c.routedPlain != nil {
		if c.wirePlain, err = newRoutedWire(c.routedPlain.json, c.writers[cur.Fingerprint]); err != nil {
			return nil, err
		}
		c.wirePlain.plain = true
	}
	if !c.routedWireAgrees() {
		c.wire, c.wirePlain = nil, nil
	}
	if !c.routedPlainAgrees() {
		c.routedPlain, c.wirePlain = nil, nil
	}
	if ew, err := newEventWire(cur.JSON); err == nil && c.eventWireAgrees(c.writers[cur.Fingerprint], ew) {
		c.event = ew
		c.stateWire = c.stateWireAgrees()
		c.stateWalk = c.stateWire && c.stateWalkAgrees()
	}
	if err := c.addNextState(); err != nil { // state_release.go
		return nil, err
	}
	return c, nil
}

// Accepted returns every accepted writer schema.
func (c *Codec) Accepted() []SchemaInfo { return slices.Clone(c.accepted) }

// header appends the single-object header of w to dst.
func header(dst []byte, w *writer) []byte {
	dst = append(dst, 0xC3, 0x01)
	return binary.LittleEndian.AppendUint64(dst, w.fp)
}

// encode appends the single-object encoding of native, written with w, to dst.
func encode(dst []byte, w *writer, native map[string]any) ([]byte, error) {
	n := len(dst)
	out, err := w.codec.BinaryFromNative(header(dst, w), native)
	if err != nil {
		return dst[:n], fmt.Errorf("codec: encode %s: %w", w.name, err)
	}
	return out, nil
}

// writerOf checks the header of b and returns its writer schema.
func (c *Codec) writerOf(b []byte) (*writer, error) {
	if id, ok := ConfluentID(b); ok {
		return nil, fmt.Errorf("%w: the Confluent wire format (registry schema ID %d), read only with a schema registry (--registry-url)", ErrNotSingleObject, id)
	}
	fp, ok := SingleObjectFingerprint(b)
	if !ok {
		return nil, fmt.Errorf("%w (%d bytes, want the marker c3 01 and an 8-byte fingerprint)", ErrNotSingleObject, len(b))
	}
	w, ok := c.writers[fp]
	if !ok {
		return nil, fmt.Errorf("%w %016x", ErrUnknownSchema, fp)
	}
	return w, nil
}

// body decodes the Avro body of b with w. goavro does not promise never to
// panic on hostile input, so a panic is recovered as ErrMalformed.
func body(b []byte, w *writer) (m map[string]any, err error) {
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("%w: %s v%d: decoder panic: %v", ErrMalformed, w.name, w.version, p)
		}
	}()
	native, rest, err := w.codec.NativeFromBinary(b[headerLen:])
	if err != nil {
		return nil, fmt.Errorf("%w: %s v%d: %v", ErrMalformed, w.name, w.version, err)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %s v%d: %d trailing bytes", ErrMalformed, w.name, w.version, len(rest))
	}
	m, ok := native.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: %s v%d: not a record", ErrMalformed, w.name, w.version)
	}
	return m, nil
}

// decodeAs checks that b was written with a schema of the named record and
// decodes its body.
func (c *Codec) decodeAs(b []byte, name string) (map[string]any, *writer, error) {
	w, err := c.writerOf(b)
	if err != nil {
		return nil, nil, err
	}
	if w.name != name {
		return nil, w, fmt.Errorf("%w: want %s, got %s v%d", ErrWrongSchema, name, w.name, w.version)
	}
	m, err := body(b, w)
	return m, w, err
}

// Decode decodes any accepted record, dispatching on its fingerprint, and
// returns *event.TaskEvent, *event.Routed, *event.BreakerEvent or
// *event.ReviewDecision. TaskEvents and ReviewDecisions are validated.
func (c *Codec) Decode(b []byte) (any, error) {
	b, err := c.singleObject(b)
	if err != nil {
		return nil, err
	}
	w, err := c.writerOf(b)
	if err != nil {
		return nil, err
	}
	switch w.name {
	case avro.TaskEvent:
		e, err := c.DecodeTaskEvent(b)
		if err != nil {
			return nil, err
		}
		return &e, nil
	case avro.RoutedRecord:
		r, err := c.DecodeRouted(b)
		if err != nil {
			return nil, err
		}
		return &r, nil
	case avro.BreakerEvent:
		e, err := c.DecodeBreakerEvent(b)
		if err != nil {
			return nil, err
		}
		return &e, nil
	case avro.TaskState:
		return c.DecodeState(b)
	case avro.ReviewDecision:
		d, err := c.DecodeReviewDecision(b)
		if err != nil {
			return nil, err
		}
		return &d, nil
	}
	return nil, fmt.Errorf("%w: no decoder for %s", ErrWrongSchema, w.name)
}
