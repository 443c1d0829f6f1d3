package codec

import "errors"

// Sentinel errors of Decode and the Decode* methods. Every decode error wraps
// exactly one of them; Kind names it for the dead-letter headers.
var (
	// ErrNotSingleObject is returned when the bytes do not start with the
	// single-object marker 0xC3 0x01 or are shorter than its 10-byte header.
	ErrNotSingleObject = errors.New("codec: not an Avro single-object encoding")
	// ErrUnknownSchema is returned when the header's fingerprint is not one of
	// the accepted writer schemas; the message carries the fingerprint in hex.
	ErrUnknownSchema = errors.New("codec: unknown schema fingerprint")
	// ErrMalformed is returned when the body does not decode with the writer
	// schema: truncated, trailing bytes, an impossible value.
	ErrMalformed = errors.New("codec: malformed Avro body")
	// ErrWrongSchema is returned when a typed decode method is given a record
	// of another type, e.g. DecodeTaskEvent given a RoutedRecord.
	ErrWrongSchema = errors.New("codec: wrong schema")
	// ErrInvalidRecord is returned when the record decodes but breaks the
	// record's contract, e.g. a TaskEvent without task_id. It wraps the
	// *event.FieldError naming the field.
	ErrInvalidRecord = errors.New("codec: invalid record")
	// ErrUnresolvableSchema is returned when a writer schema from a schema
	// registry does not resolve against the reader's schema by the Avro
	// rules; it wraps the *SchemaMismatchError naming the field.
	ErrUnresolvableSchema = errors.New("codec: writer schema does not resolve against the reader's")
)

// Kind returns the short name of err's sentinel for the dead-letter header
// faultrouter.error.kind: not_single_object, unknown_schema, malformed,
// wrong_schema, invalid_record or unresolvable_schema; "" for nil and "error" for anything else.
func Kind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotSingleObject):
		return "not_single_object"
	case errors.Is(err, ErrUnknownSchema):
		return "unknown_schema"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrWrongSchema):
		return "wrong_schema"
	case errors.Is(err, ErrInvalidRecord):
		return "invalid_record"
	case errors.Is(err, ErrUnresolvableSchema):
		return "unresolvable_schema"
	}
	return "error"
}
