package avro

import (
	"fmt"
	"strings"
	"testing"
)

// TestCanonicalForm guards the Parsing Canonical Form rules of the Avro
// specification one at a time: simple primitives (logical types dropped),
// full names, only the parsing attributes in the specification's order,
// named types in full once and by name after that. The
// expected strings are what Java's SchemaNormalization.toParsingForm prints
// for the same inputs.
func TestCanonicalForm(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"primitive", `"int"`, `"int"`},
		{"primitive_object", `{"type": "string"}`, `"string"`},
		{"logical_type", `{"type":"long","logicalType":"timestamp-millis"}`, `"long"`},
		{"array_map", `{"type":"array","items":{"type":"map","values":"double","doc":"x"}}`,
			`{"type":"array","items":{"type":"map","values":"double"}}`},
		{"union", `["null", {"type":"int","logicalType":"date"}]`, `["null","int"]`},
		{"record_strip_and_order",
			`{"fields":[{"default":0,"type":"int","name":"a","doc":"d","aliases":["b"]}],"doc":"d","namespace":"ns","name":"R","type":"record","aliases":["Q"]}`,
			`{"name":"ns.R","type":"record","fields":[{"name":"a","type":"int"}]}`},
		{"nested_inherits_namespace",
			`{"type":"record","name":"R","namespace":"ns","fields":[
				{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"],"default":"A","doc":"x"}},
				{"name":"f","type":"E"},
				{"name":"g","type":"ns.E"}]}`,
			`{"name":"ns.R","type":"record","fields":[{"name":"e","type":{"name":"ns.E","type":"enum","symbols":["A","B"]}},{"name":"f","type":"ns.E"},{"name":"g","type":"ns.E"}]}`},
		{"nested_own_namespace",
			`{"type":"record","name":"R","namespace":"ns","fields":[
				{"name":"x","type":{"type":"record","name":"X","namespace":"other","fields":[
					{"name":"y","type":{"type":"fixed","name":"Y","size":16}}]}},
				{"name":"z","type":"other.Y"}]}`,
			`{"name":"ns.R","type":"record","fields":[{"name":"x","type":{"name":"other.X","type":"record","fields":[{"name":"y","type":{"name":"other.Y","type":"fixed","size":16}}]}},{"name":"z","type":"other.Y"}]}`},
		{"dotted_name_wins",
			`{"type":"record","name":"a.b.R","namespace":"ns","fields":[{"name":"s","type":{"type":"record","name":"S","fields":[]}}]}`,
			`{"name":"a.b.R","type":"record","fields":[{"name":"s","type":{"name":"a.b.S","type":"record","fields":[]}}]}`},
		{"no_namespace", `{"type":"enum","name":"E","symbols":["A"]}`, `{"name":"E","type":"enum","symbols":["A"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalForm(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestCanonicalFormErrors guards that a schema the canonical form cannot be
// computed for is an error naming the problem, not a wrong fingerprint.
func TestCanonicalFormErrors(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"type":"record","name":"R","fields":[{"name":"a","type":"Missing"}]}`, `"Missing" is not defined`},
		{`{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"enum","name":"R","symbols":[]}}]}`, `"R" is defined twice`},
		{`{"type":"fixed","name":"F","size":-1}`, "size"},
		{`{"type":"record","fields":[]}`, "needs a name"},
		{`{"type":`, "canonical form"},
	} {
		_, err := CanonicalForm(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want one containing %q", tt.in, err, tt.want)
		}
	}
}

// TestFingerprint64 guards CRC-64-AVRO: the empty string's fingerprint is
// the algorithm's seed, and the specification's examples hold.
func TestFingerprint64(t *testing.T) {
	if got := Fingerprint64(nil); got != 0xc15d213aa4d7a795 {
		t.Fatalf("empty: %016x", got)
	}
	for _, tt := range []struct {
		schema string
		want   int64 // as Java's SchemaNormalization.parsingFingerprint64 prints it
	}{
		{`"null"`, 7195948357588979594},
		{`"int"`, 8247732601305521295},
		{`"string"`, -8142146995180207161},
	} {
		fp, err := SchemaFingerprint(tt.schema)
		if err != nil {
			t.Fatal(err)
		}
		if int64(fp) != tt.want {
			t.Errorf("%s: %d, want %d", tt.schema, int64(fp), tt.want)
		}
	}
}

// TestCatalogFingerprints guards that every catalog entry carries the
// fingerprint of its own composed text, distinct from every other entry's.
func TestCatalogFingerprints(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]string{}
	for _, s := range all {
		id := fmt.Sprintf("%s v%d", s.Name, s.Version)
		fp, err := SchemaFingerprint(s.JSON)
		if err != nil || fp != s.Fingerprint {
			t.Errorf("%s: fingerprint %016x, recomputed %016x (%v)", id, s.Fingerprint, fp, err)
		}
		for _, f := range []uint64{s.Fingerprint, s.Legacy} {
			if prev, dup := seen[f]; dup && f != 0 {
				t.Errorf("%s and %s share %016x", id, prev, f)
			}
			seen[f] = id
		}
	}
}
