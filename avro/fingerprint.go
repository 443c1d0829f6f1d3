package avro

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// This file computes schema fingerprints exactly as the Avro specification
// defines them ("Parsing Canonical Form for Schemas" and "Schema
// Fingerprints"), so that the header faultrouter writes is the one Java's
// BinaryMessageEncoder, fastavro and every other conforming library compute
// for the same schema. It does not rely on goavro, whose canonical form keeps
// logical types and so differs from the specification's.

// crc64Empty is the CRC-64-AVRO fingerprint of the empty string, the seed
// and polynomial of the specification's reference implementation.
const crc64Empty = 0xc15d213aa4d7a795

var crc64Table = func() (t [256]uint64) {
	for i := range t {
		fp := uint64(i)
		for range 8 {
			fp = (fp >> 1) ^ (crc64Empty & -(fp & 1))
		}
		t[i] = fp
	}
	return t
}()

// Fingerprint64 returns the CRC-64-AVRO (Rabin) fingerprint of b. Applied to
// a schema's Parsing Canonical Form it is the 8-byte fingerprint of the
// single-object encoding (written little-endian on the wire).
func Fingerprint64(b []byte) uint64 {
	fp := uint64(crc64Empty)
	for _, c := range b {
		fp = (fp >> 8) ^ crc64Table[byte(fp)^c]
	}
	return fp
}

// SchemaFingerprint returns the CRC-64-AVRO fingerprint of the Parsing
// Canonical Form of the schema text.
func SchemaFingerprint(schema string) (uint64, error) {
	pcf, err := CanonicalForm(schema)
	if err != nil {
		return 0, err
	}
	return Fingerprint64([]byte(pcf)), nil
}

// primitives are the Avro primitive type names.
var primitives = map[string]bool{
	"null": true, "boolean": true, "int": true, "long": true,
	"float": true, "double": true, "bytes": true, "string": true,
}

// CanonicalForm returns the Parsing Canonical Form of a schema text, by the
// specification's transformations: primitives in their simple form
// ({"type":"long","logicalType":"timestamp-millis"} is "long"), full names
// for every named type, only the attributes that matter for parsing (name,
// type, fields, symbols, items, values, size, in that order), no whitespace.
// A named type is written in full at its first appearance and by full name
// after that.
func CanonicalForm(schema string) (string, error) {
	dec := json.NewDecoder(strings.NewReader(schema))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("avro: canonical form: %w", err)
	}
	c := canonicalizer{seen: map[string]bool{}}
	if err := c.write(v, ""); err != nil {
		return "", fmt.Errorf("avro: canonical form: %w", err)
	}
	return c.buf.String(), nil
}

type canonicalizer struct {
	buf  bytes.Buffer
	seen map[string]bool // named types already written in full
}

// write appends the canonical form of schema t, read in namespace ns.
func (c *canonicalizer) write(t any, ns string) error {
	switch v := t.(type) {
	case string:
		if primitives[v] {
			c.str(v)
			return nil
		}
		full := qualify(v, ns)
		if !c.seen[full] {
			return fmt.Errorf("type %q is not defined before its use", full)
		}
		c.str(full)
		return nil
	case []any: // union
		c.buf.WriteByte('[')
		for i, b := range v {
			if i > 0 {
				c.buf.WriteByte(',')
			}
			if err := c.write(b, ns); err != nil {
				return err
			}
		}
		c.buf.WriteByte(']')
		return nil
	case map[string]any:
		return c.object(v, ns)
	}
	return fmt.Errorf("a schema is a string, an array or an object, not %T", t)
}

func (c *canonicalizer) object(m map[string]any, ns string) error {
	typ, ok := m["type"].(string)
	if !ok {
		// {"type": {...}} or {"type": [...]}: the attribute is itself a schema.
		if inner, has := m["type"]; has {
			return c.write(inner, ns)
		}
		return fmt.Errorf("an object schema needs a type")
	}
	switch typ {
	case "record", "error", "enum", "fixed":
	case "array":
		c.buf.WriteString(`{"type":"array","items":`)
		if err := c.write(m["items"], ns); err != nil {
			return err
		}
		c.buf.WriteByte('}')
		return nil
	case "map":
		c.buf.WriteString(`{"type":"map","values":`)
		if err := c.write(m["values"], ns); err != nil {
			return err
		}
		c.buf.WriteByte('}')
		return nil
	default: // a primitive with attributes, e.g. a logical type: its simple form
		return c.write(typ, ns)
	}

	name, _ := m["name"].(string)
	if name == "" {
		return fmt.Errorf("a %s needs a name", typ)
	}
	if explicit, _ := m["namespace"].(string); explicit != "" && !strings.Contains(name, ".") {
		ns = explicit
	}
	full := qualify(name, ns)
	if c.seen[full] {
		return fmt.Errorf("type %q is defined twice", full)
	}
	c.seen[full] = true
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		ns = full[:i] // names inside this type are read in its namespace
	} else {
		ns = ""
	}
	c.buf.WriteString(`{"name":`)
	c.str(full)
	c.buf.WriteString(`,"type":`)
	if typ == "error" {
		c.str("error")
	} else {
		c.str(typ)
	}
	switch typ {
	case "record", "error":
		fields, ok := m["fields"].([]any)
		if !ok {
			return fmt.Errorf("record %s needs fields", full)
		}
		c.buf.WriteString(`,"fields":[`)
		for i, f := range fields {
			fm, ok := f.(map[string]any)
			if !ok {
				return fmt.Errorf("record %s: a field is not an object", full)
			}
			fname, _ := fm["name"].(string)
			if fname == "" {
				return fmt.Errorf("record %s: a field has no name", full)
			}
			if i > 0 {
				c.buf.WriteByte(',')
			}
			c.buf.WriteString(`{"name":`)
			c.str(fname)
			c.buf.WriteString(`,"type":`)
			if err := c.write(fm["type"], ns); err != nil {
				return fmt.Errorf("%s.%s: %w", full, fname, err)
			}
			c.buf.WriteByte('}')
		}
		c.buf.WriteByte(']')
	case "enum":
		symbols, ok := m["symbols"].([]any)
		if !ok {
			return fmt.Errorf("enum %s needs symbols", full)
		}
		c.buf.WriteString(`,"symbols":[`)
		for i, s := range symbols {
			sym, ok := s.(string)
			if !ok {
				return fmt.Errorf("enum %s: a symbol is not a string", full)
			}
			if i > 0 {
				c.buf.WriteByte(',')
			}
			c.str(sym)
		}
		c.buf.WriteByte(']')
	case "fixed":
		size, err := fixedSize(m["size"])
		if err != nil {
			return fmt.Errorf("fixed %s: %w", full, err)
		}
		c.buf.WriteString(`,"size":`)
		c.buf.WriteString(strconv.FormatInt(size, 10))
	}
	c.buf.WriteByte('}')
	return nil
}

// str appends s as a JSON string literal. The specification wants escapes
// replaced by the characters themselves; only the quote, the backslash and
// control characters, which JSON cannot carry raw, stay escaped.
func (c *canonicalizer) str(s string) {
	c.buf.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			c.buf.WriteByte('\\')
			c.buf.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(&c.buf, `\u%04x`, r)
		default:
			c.buf.WriteRune(r)
		}
	}
	c.buf.WriteByte('"')
}

// qualify returns the full name of name read in namespace ns.
func qualify(name, ns string) string {
	if strings.Contains(name, ".") || ns == "" {
		return name
	}
	return ns + "." + name
}

func fixedSize(v any) (int64, error) {
	var s string
	switch n := v.(type) {
	case json.Number:
		s = n.String()
	case string: // [INTEGERS]: quotes and leading zeros go
		s = n
	default:
		return 0, fmt.Errorf("size must be an integer")
	}
	size, err := strconv.ParseInt(s, 10, 64)
	if err != nil || size < 0 {
		return 0, fmt.Errorf("size must be a non-negative integer, not %q", s)
	}
	return size, nil
}
