// Package avro holds faultrouter's wire contract: the Avro schemas of every
// record the router reads or writes, embedded into the binary, and the
// explicit list of schema versions it accepts.
//
// A schema file may reference a named type defined in another file of this
// directory by its full name (for example "faultrouter.TaskEvent" in
// routed_record.avsc); the loader inlines that definition at its first use, so
// that each type is written once. Files under history/ are frozen, fully
// composed copies of older versions and are never edited.
package avro

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"sync"
)

//go:embed *.avsc history/*.avsc
var files embed.FS

// Full names of the top-level records.
const (
	TaskEvent      = "faultrouter.TaskEvent"
	RoutedRecord   = "faultrouter.RoutedRecord"
	BreakerEvent   = "faultrouter.BreakerEvent"
	ReviewDecision = "faultrouter.ReviewDecision"
	TaskState      = "faultrouter.TaskState"
)

// Schema is one version of a record schema.
type Schema struct {
	// Name is the record's full name, e.g. faultrouter.TaskEvent.
	Name string
	// Version counts the record's schema changes, starting at 1.
	Version int
	// Current is true for the version this build writes.
	Current bool
	// File is the schema's path in this directory.
	File string
	// JSON is the composed schema text: every referenced type inlined.
	JSON string
	// Fingerprint is the CRC-64-AVRO fingerprint of JSON's Parsing Canonical
	// Form, as the Avro specification defines it: the number in the header
	// of the single-object encoding, the one Java's and fastavro's encoders
	// write.
	Fingerprint uint64
	// Legacy is the fingerprint earlier faultrouter builds wrote for this
	// version (goavro's non-standard canonical form), accepted on read so
	// that records already on the topics still decode; 0 if none.
	Legacy uint64
}

// catalog lists every accepted schema version. Adding a version means: copy
// the composed text of the current one to history/, bump Version here, edit
// the file (following README.md's rules), and add the old entry below.
//
// Legacy pins the fingerprints that builds before the switch to the
// specification's fingerprints wrote. They are constants, not recomputed, so
// that old records keep decoding whatever happens to the library that
// computed them. A new version has no legacy fingerprint.
var catalog = []Schema{
	{Name: TaskEvent, Version: 2, Current: true, File: "task_event.avsc", Legacy: 0x5d0bcc432a258366},
	{Name: TaskEvent, Version: 1, File: "history/task_event.v1.avsc", Legacy: 0xa90687447f509429},
	{Name: RoutedRecord, Version: 3, Current: true, File: "routed_record.avsc"},
	{Name: RoutedRecord, Version: 2, File: "history/routed_record.v2.avsc"},
	{Name: RoutedRecord, Version: 1, File: "history/routed_record.v1.avsc", Legacy: 0x5b538e71ed324dad},
	{Name: BreakerEvent, Version: 1, Current: true, File: "breaker_event.avsc", Legacy: 0x2c69021ae9021289},
	{Name: ReviewDecision, Version: 1, Current: true, File: "review_decision.avsc", Legacy: 0x3d9e8d1b8e393048},
	{Name: TaskState, Version: 2, Current: true, File: "task_state.avsc"},
	{Name: TaskState, Version: 1, File: "history/task_state.v1.avsc"},
}

// includes maps the full name of a shared named type to the file defining it.
var includes = map[string]string{
	TaskEvent:           "task_event.avsc",
	"faultrouter.Class": "class.avsc",
}

var (
	loadOnce sync.Once
	loaded   []Schema
	loadErr  error
)

// All returns every accepted schema version, current ones first within each
// record, with its composed JSON.
func All() ([]Schema, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	if loadErr != nil {
		return nil, loadErr
	}
	return append([]Schema(nil), loaded...), nil
}

// Current returns the version of the named record this build writes.
func Current(name string) (Schema, error) {
	all, err := All()
	if err != nil {
		return Schema{}, err
	}
	for _, s := range all {
		if s.Name == name && s.Current {
			return s, nil
		}
	}
	return Schema{}, fmt.Errorf("avro: no current schema named %q", name)
}

// Version returns the given version of the named record.
func Version(name string, version int) (Schema, error) {
	all, err := All()
	if err != nil {
		return Schema{}, err
	}
	for _, s := range all {
		if s.Name == name && s.Version == version {
			return s, nil
		}
	}
	return Schema{}, fmt.Errorf("avro: no schema %s version %d", name, version)
}

func load() ([]Schema, error) {
	out := make([]Schema, len(catalog))
	for i, s := range catalog {
		text, err := compose(s.File)
		if err != nil {
			return nil, err
		}
		s.JSON = text
		if s.Fingerprint, err = SchemaFingerprint(text); err != nil {
			return nil, fmt.Errorf("avro: %s: %w", s.File, err)
		}
		out[i] = s
	}
	return out, nil
}

// compose reads file and inlines every included named type at its first use.
func compose(file string) (string, error) {
	root, err := readJSON(file)
	if err != nil {
		return "", err
	}
	defined := map[string]bool{}
	if m, ok := root.(map[string]any); ok {
		defined[fullName(m)] = true
	}
	root, err = inline(root, defined)
	if err != nil {
		return "", fmt.Errorf("avro: %s: %w", file, err)
	}
	b, err := json.Marshal(root)
	if err != nil {
		return "", fmt.Errorf("avro: %s: %w", file, err)
	}
	return string(b), nil
}

func readJSON(file string) (any, error) {
	b, err := files.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("avro: %s: %w", file, err)
	}
	return v, nil
}

// inline walks a type in document order and replaces the first reference to
// an included name with its definition.
func inline(t any, defined map[string]bool) (any, error) {
	switch v := t.(type) {
	case string:
		file, ok := includes[v]
		if !ok || defined[v] {
			return v, nil
		}
		defined[v] = true
		def, err := readJSON(file)
		if err != nil {
			return nil, err
		}
		return inline(def, defined)
	case []any: // union
		for i := range v {
			var err error
			if v[i], err = inline(v[i], defined); err != nil {
				return nil, err
			}
		}
		return v, nil
	case map[string]any:
		switch v["type"] {
		case "record":
			defined[fullName(v)] = true
			fields, _ := v["fields"].([]any)
			for _, f := range fields {
				fm, ok := f.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("record %v: a field is not an object", v["name"])
				}
				var err error
				if fm["type"], err = inline(fm["type"], defined); err != nil {
					return nil, err
				}
			}
		case "array":
			var err error
			if v["items"], err = inline(v["items"], defined); err != nil {
				return nil, err
			}
		case "map":
			var err error
			if v["values"], err = inline(v["values"], defined); err != nil {
				return nil, err
			}
		case "enum", "fixed":
			defined[fullName(v)] = true
		}
		return v, nil
	}
	return t, nil
}

// fullName is the namespace-qualified name of a named type defined in the
// faultrouter namespace (the only namespace of these schemas).
func fullName(m map[string]any) string {
	name, _ := m["name"].(string)
	if ns, _ := m["namespace"].(string); ns != "" {
		return ns + "." + name
	}
	return "faultrouter." + name
}
