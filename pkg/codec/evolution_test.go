package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/linkedin/goavro/v2"
)

// v1Event is fullEvent without the fields TaskEvent v2 added.
func v1Event() event.TaskEvent {
	e := fullEvent()
	e.InputRef, e.SLAMs = nil, nil
	return e
}

func goavroCodec(t *testing.T, name string, version int) *goavro.Codec {
	t.Helper()
	s, err := avro.Version(name, version)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := goavro.NewCodec(s.JSON)
	if err != nil {
		t.Fatal(err)
	}
	return gc
}

// TestCurrentReaderReadsOlderWriter guards backward compatibility: a record a
// worker wrote with TaskEvent v1 (no input_ref, no sla_ms) is accepted by the
// current router and reads with those fields at their defaults.
func TestCurrentReaderReadsOlderWriter(t *testing.T) {
	c := newCodec(t)
	v1 := goavroCodec(t, avro.TaskEvent, 1)
	e := v1Event()
	b, err := specSingle(v1, taskEventNative(&e)) // an older worker's bytes
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(b[2:10]) != specFingerprint(t, v1) {
		t.Fatal("not written with the v1 fingerprint")
	}
	got, err := c.DecodeTaskEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, e) {
		t.Fatalf("got %+v\nwant %+v", got, e)
	}
}

// TestOlderReaderReadsNewerWriter guards forward compatibility: a program
// built for TaskEvent v1, which knows the v2 writer schema from the accepted
// set, reads a v2 record into the v1 field set and writes v1 itself.
func TestOlderReaderReadsNewerWriter(t *testing.T) {
	old, err := NewWith(Options{TaskEventVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	cur := newCodec(t)
	e := fullEvent() // with input_ref and sla_ms
	b, err := cur.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := old.DecodeTaskEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := v1Event(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// The same holds for the event inside a routed record.
	r := fullRouted()
	rb, err := cur.EncodeRouted(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	gotR, err := old.DecodeRouted(rb)
	if err != nil {
		t.Fatal(err)
	}
	if gotR.Event.InputRef != nil || gotR.Event.SLAMs != nil {
		t.Fatalf("v1 reader kept v2 fields: %+v", gotR.Event)
	}
	// The old program writes v1, which the current one reads.
	ob, err := old.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	if fp := binary.LittleEndian.Uint64(ob[2:10]); fp != specFingerprint(t, goavroCodec(t, avro.TaskEvent, 1)) {
		t.Fatalf("old codec wrote fingerprint %016x, want v1", fp)
	}
	if back, err := cur.DecodeTaskEvent(ob); err != nil || !reflect.DeepEqual(back, v1Event()) {
		t.Fatalf("current reads old writer: %+v, %v", back, err)
	}
	var writes []string
	for _, s := range old.Accepted() {
		if s.Writes {
			writes = append(writes, s.Name+"/"+s.Fingerprint)
		}
	}
	if len(writes) != 6 || writes[0] != avro.TaskEvent+"/"+wantFingerprints["faultrouter.TaskEvent/1"] {
		t.Fatalf("old codec writes %v", writes)
	}
}

// TestFutureWriter guards the reader rules for a writer schema that has grown
// (once it is in the accepted set): an unknown field is ignored and an enum
// symbol the reader does not know reads as the enum's default.
func TestFutureWriter(t *testing.T) {
	c := newCodec(t)
	cur, err := avro.Current(avro.TaskEvent)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(cur.JSON), &s); err != nil {
		t.Fatal(err)
	}
	fields := s["fields"].([]any)
	for _, f := range fields {
		fm := f.(map[string]any)
		if fm["name"] == "operation" {
			op := fm["type"].([]any)[1].(map[string]any)
			for _, of := range op["fields"].([]any) {
				ofm := of.(map[string]any)
				if ofm["name"] == "state" {
					enum := ofm["type"].(map[string]any)
					enum["symbols"] = append(enum["symbols"].([]any), "COMPENSATED")
				}
			}
		}
	}
	s["fields"] = append(fields, map[string]any{"name": "tenant_tier", "type": "string", "default": "free"})
	future, _ := json.Marshal(s)
	gc, err := goavro.NewCodec(string(future))
	if err != nil {
		t.Fatal(err)
	}
	fp := specFingerprint(t, gc)
	c.writers[fp] = &writer{name: avro.TaskEvent, version: 3, fp: fp, codec: gc} // accept it

	e := fullEvent()
	native := taskEventNative(&e)
	native["tenant_tier"] = "gold"
	native["operation"].(map[string]any)["faultrouter.Operation"].(map[string]any)["state"] = "COMPENSATED"
	b, err := specSingle(gc, native)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.DecodeTaskEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	want := fullEvent()
	want.Operation.State = event.OpUnknown // OpState's default: held for reconciliation
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestProjectionCoversSchema guards the field table used to read into older
// versions: it lists exactly the current TaskEvent schema's field paths, so a
// new field cannot be added to the schema and forgotten by older readers.
func TestProjectionCoversSchema(t *testing.T) {
	cur, err := avro.Current(avro.TaskEvent)
	if err != nil {
		t.Fatal(err)
	}
	var root any
	if err := json.Unmarshal([]byte(cur.JSON), &root); err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	(&view{enums: map[string]enumSet{}}).walk(root, "", paths)
	table := map[string]bool{}
	for _, f := range taskEventFields {
		table[f.path] = true
		if !paths[f.path] {
			t.Errorf("table path %s is not in the schema", f.path)
		}
	}
	for p := range paths {
		if !table[p] {
			t.Errorf("schema path %s is missing from taskEventFields", p)
		}
	}
	c := newCodec(t)
	if len(c.view.dropTaskEvent) != 0 {
		t.Fatalf("the current reader drops %d fields", len(c.view.dropTaskEvent))
	}
}

// TestUnknownVersion guards NewWith: a TaskEvent version that is not in the
// catalog is a clear error, not a codec that silently writes another version.
func TestUnknownVersion(t *testing.T) {
	if _, err := NewWith(Options{TaskEventVersion: 9}); err == nil {
		t.Fatal("NewWith accepted TaskEventVersion 9")
	}
}

// TestRoutedRecordV2ReadsWithoutOverride guards RoutedRecord version 3's
// evolution: a record an earlier build wrote with version 2, which has no
// decision.override, is still accepted and decodes with every field as
// written and the override empty (its default, null).
func TestRoutedRecordV2ReadsWithoutOverride(t *testing.T) {
	c := newCodec(t)
	r := fullRouted()
	r.Decision.Prevented = &event.Prevented{Stop: "refusal", BaselineRetries: 3, Attempts: 2, USD: 0.04}
	n := teNatives.Get().(*teNative)
	defer n.release()
	native := map[string]any{
		"event":    map[string]any{avro.TaskEvent: n.fill(r.Event)},
		"decision": decisionNative(&r.Decision),
		"input": map[string]any{"topic": r.Input.Topic, "partition": r.Input.Partition, "offset": r.Input.Offset,
			"timestamp": r.Input.Timestamp.Millis()},
	}
	delete(native["decision"].(map[string]any), "override")
	b, err := specSingle(goavroCodec(t, avro.RoutedRecord, 2), native)
	if err != nil {
		t.Fatal(err)
	}
	if name, v, err := c.WriterVersion(b); err != nil || name != avro.RoutedRecord || v != 2 {
		t.Fatalf("written as %s v%d (%v), want RoutedRecord v2", name, v, err)
	}
	got, err := c.DecodeRouted(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("v2 record decoded as\n%+v\nwant\n%+v", got.Decision, r.Decision)
	}
}

// TestNoOverrideWritesVersion2 guards RoutedRecord version 3's rollout: a
// decision no policy override made is written with version 2, byte for
// byte what a version-2 writer writes, so a reader that knows only version
// 2 (an earlier build's tail, console or worker; a consumer pinned to its
// fingerprint) reads every record of a policy without overrides; a
// decision an override made is written with version 3, and both decode.
func TestNoOverrideWritesVersion2(t *testing.T) {
	c := newCodec(t)
	if c.wirePlain == nil {
		t.Error("version 2 is written with goavro: routed_wire.go's encoder does not agree with it")
	}
	v2 := goavroCodec(t, avro.RoutedRecord, 2)
	v2fp := specFingerprint(t, v2)
	for _, r := range routedSamples() {
		r.Decision.Totals.CostUSD = 1.25 // not the sample's infinity, which DecodeRouted refuses
		for _, override := range []string{"", "acme-timeouts"} {
			r.Decision.Override = override
			b, err := c.EncodeRouted(nil, &r)
			if err != nil {
				t.Fatal(err)
			}
			_, v, err := c.WriterVersion(b)
			switch {
			case err != nil:
				t.Fatal(err)
			case r.Decision.Override == "" && v != 2:
				t.Errorf("a decision without an override is written with version %d, want 2", v)
			case r.Decision.Override != "" && v != 3:
				t.Errorf("a decision of override %q is written with version %d, want 3", r.Decision.Override, v)
			}
			if got, err := c.DecodeRouted(b); err != nil || !reflect.DeepEqual(got, r) {
				t.Errorf("decoded as %+v (%v), want %+v", got.Decision, err, r.Decision)
			}
			if v != 2 {
				continue
			}
			if fp := binary.LittleEndian.Uint64(b[2:10]); fp != v2fp {
				t.Errorf("fingerprint %016x, want version 2's %016x", fp, v2fp)
			}
			native, rest, err := v2.NativeFromBinary(b[10:])
			if err != nil || len(rest) != 0 {
				t.Fatalf("a version-2 reader: %v (%d bytes left)", err, len(rest))
			}
			back, err := specSingle(v2, native)
			if err != nil || !bytes.Equal(back, b) {
				t.Errorf("a version-2 writer writes other bytes (%v)", err)
			}
		}
	}
}

// TestCurrentRoutedOnly guards the codec of a router on the Confluent wire
// format: every routed record is the current version, which its subjects
// hold, also without an override.
func TestCurrentRoutedOnly(t *testing.T) {
	c, err := NewWith(Options{CurrentRoutedOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	r := routedSamples()[1]
	b, err := c.EncodeRouted(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	if _, v, err := c.WriterVersion(b); err != nil || v != 3 {
		t.Errorf("written with version %d (%v), want 3", v, err)
	}
}
