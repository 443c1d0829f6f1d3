package codec

import (
	"encoding/binary"
	"fmt"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/linkedin/goavro/v2"
)

// The Confluent wire format, which schema registry serializers write: the
// byte 0x00, the writer schema's 4-byte big-endian registry ID, and the Avro
// binary body. The codec itself reads and writes the single-object encoding;
// a record in the Confluent format is turned into one by a Foreign (the
// writer schema the registry holds for its ID), and a single-object record
// is turned into the Confluent format by ToConfluent.

// ConfluentHeaderLen is the length of the Confluent format's header.
const ConfluentHeaderLen = 5

// ConfluentID returns the registry schema ID of a record in the Confluent
// wire format; ok is false when b is not in that format.
func ConfluentID(b []byte) (id uint32, ok bool) {
	if len(b) < ConfluentHeaderLen || b[0] != 0 {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[1:ConfluentHeaderLen]), true
}

// IsSingleObject tells whether b starts with the single-object marker.
func IsSingleObject(b []byte) bool { return len(b) >= 2 && b[0] == 0xC3 && b[1] == 0x01 }

// SingleObjectFingerprint returns the writer schema's fingerprint in the
// header of a single-object encoding; ok is false when b has no such header.
func SingleObjectFingerprint(b []byte) (fp uint64, ok bool) {
	if len(b) < headerLen || !IsSingleObject(b) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[2:headerLen]), true
}

// ToConfluent rewrites, in place, the single-object encoding v into the
// Confluent wire format with the schema ID id, and returns it (5 bytes
// shorter). A value that is not a single-object encoding is returned as it
// is.
func ToConfluent(v []byte, id uint32) []byte {
	if len(v) < headerLen || !IsSingleObject(v) {
		return v
	}
	v[0] = 0
	binary.BigEndian.PutUint32(v[1:ConfluentHeaderLen], id)
	n := copy(v[ConfluentHeaderLen:], v[headerLen:])
	return v[:ConfluentHeaderLen+n]
}

// Fingerprint returns the writer fingerprint of a single-object encoding;
// ok is false when b is not one.
func Fingerprint(b []byte) (fp uint64, ok bool) {
	if len(b) < headerLen || !IsSingleObject(b) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[2:headerLen]), true
}

// SchemaOf returns the schema text of the accepted writer schema with the
// given fingerprint; ok is false when it is not accepted.
func (c *Codec) SchemaOf(fp uint64) (text string, ok bool) {
	w, ok := c.writers[fp]
	if !ok {
		return "", false
	}
	return w.json, true
}

// Foreign is a writer schema that is not necessarily one of the codec's
// own, e.g. one a schema registry holds: either one of the accepted
// schemas, whose records need only a new header, or one resolved against
// the codec's reader schema of the same record.
type Foreign struct {
	// Name is the full name of the reader's record it resolves to.
	Name string
	same *writer // the accepted writer schema of the same canonical form
	// otherwise: the writer's codec, the conversion to the reader's natives
	// and the reader's writer
	codec  *goavro.Codec
	conv   convert
	reader *writer
}

// Foreign parses a writer schema and resolves it against the reader schema
// of the record of the same name (TaskEvent, ReviewDecision, BreakerEvent or
// RoutedRecord). It returns an error wrapping ErrUnresolvableSchema (and a
// *SchemaMismatchError naming the field) when it does not resolve.
func (c *Codec) Foreign(text string) (*Foreign, error) {
	if fp, err := avro.SchemaFingerprint(text); err == nil {
		if w, ok := c.writers[fp]; ok && w.name != avro.TaskState {
			return &Foreign{Name: w.name, same: w}, nil
		}
	}
	ws, err := parseSchema(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnresolvableSchema, err)
	}
	if ws.kind != "record" {
		return nil, fmt.Errorf("%w: the writer schema is a %s, not a record", ErrUnresolvableSchema, ws.kind)
	}
	if path := zeroWidthArray(ws, "", map[*schema]bool{}); path != "" {
		// a few bytes of such an array decode into millions of items
		return nil, fmt.Errorf("%w: %w", ErrUnresolvableSchema, &SchemaMismatchError{Path: path,
			Msg: "an array of items that take no bytes, which faultrouter does not read"})
	}
	var reader *writer
	for _, w := range []*writer{c.taskEvent, c.review, c.breaker, c.routed} {
		if short(w.name) == short(ws.name) {
			reader = w
		}
	}
	if reader == nil {
		return nil, fmt.Errorf("%w: the writer's record %s is none of TaskEvent, ReviewDecision, BreakerEvent, RoutedRecord", ErrUnresolvableSchema, ws.name)
	}
	rs, err := parseSchema(reader.json)
	if err != nil {
		return nil, err
	}
	conv, err := resolveSchemas(ws, rs)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnresolvableSchema, reader.name, err)
	}
	gc, err := goavro.NewCodec(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnresolvableSchema, err)
	}
	return &Foreign{Name: reader.name, codec: gc, conv: conv, reader: reader}, nil
}

// SingleObject appends to dst the single-object encoding of the Avro body
// written with f's schema: the same body with the accepted schema's header,
// or the body decoded, resolved and encoded again with the reader's schema.
func (f *Foreign) SingleObject(dst, body []byte) (out []byte, err error) {
	if f.same != nil {
		return append(header(dst, f.same), body...), nil
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = dst, fmt.Errorf("%w: %s: decoder panic: %v", ErrMalformed, f.Name, p)
		}
	}()
	native, rest, err := f.codec.NativeFromBinary(body)
	if err != nil {
		return dst, fmt.Errorf("%w: %s (registry schema): %v", ErrMalformed, f.Name, err)
	}
	if len(rest) != 0 {
		return dst, fmt.Errorf("%w: %s (registry schema): %d trailing bytes", ErrMalformed, f.Name, len(rest))
	}
	v, err := f.conv(native)
	if err != nil {
		return dst, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return dst, fmt.Errorf("%w: %s: not a record", ErrMalformed, f.Name)
	}
	return encode(dst, f.reader, m)
}

// SchemaSource finds the writer schema of a schema registry ID, e.g. a
// registry client with a cache (package registry). Its error wraps
// ErrUnknownSchema for an ID the registry does not know and
// ErrUnresolvableSchema for a schema that does not resolve.
type SchemaSource interface {
	WriterSchema(id uint32) (*Foreign, error)
}

// WithSchemas returns a copy of c whose Decode methods also read records in
// the Confluent wire format, with the writer schemas src finds. Each record
// of an ID not yet known to src may cost src a request: the router instead
// rewrites a batch's records first (it must wait out a registry that does
// not answer), and readers of a topic use this.
func (c *Codec) WithSchemas(src SchemaSource) *Codec {
	cp := *c
	cp.schemas = src
	return &cp
}

// singleObject returns b in the single-object encoding: b itself, or the
// rewrite of a record in the Confluent wire format when c has a
// SchemaSource.
func (c *Codec) singleObject(b []byte) ([]byte, error) {
	if c.schemas == nil {
		return b, nil
	}
	id, ok := ConfluentID(b)
	if !ok {
		return b, nil
	}
	f, err := c.schemas.WriterSchema(id)
	if err != nil {
		return nil, err
	}
	return f.SingleObject(nil, b[ConfluentHeaderLen:])
}
