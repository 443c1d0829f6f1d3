package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/linkedin/goavro/v2"
)

func newCodec(t testing.TB) *Codec {
	t.Helper()
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

var t0 = event.At(time.Date(2026, 3, 1, 12, 30, 45, 123e6, time.UTC))

// fullEvent has every TaskEvent field set.
func fullEvent() event.TaskEvent {
	return event.TaskEvent{
		EventID: "ev-1", TaskID: "task-1", Attempt: 2, OccurredAt: t0,
		Source: "refund-worker", Action: "refund",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v3",
		Stage: event.StageBusiness, Status: event.StatusError,
		Error: &event.Error{Type: "HTTPError", HTTPStatus: 429, Code: "CODE_2101", Message: "slow down", RetryAfterMs: ptr(int64(1500))},
		Output: &event.Output{Text: "退款已处理", SchemaValid: ptr(false), Confidence: ptr(0.42),
			Flags: []string{"fabricated_data", "compliance_violation"}},
		Usage:      event.Usage{CostUSD: 0.0123, Tokens: 812, ElapsedMs: 2300},
		Operation:  &event.Operation{OpID: "op-9", Kind: event.OpWrite, ParamsSHA256: "ab12", State: event.OpUnknown},
		InputRef:   &event.InputRef{URI: "s3://bucket/in.pdf", SHA256: "cd34", SizeBytes: 1 << 20},
		SLAMs:      ptr(int64(60000)),
		Attributes: map[string]string{"tenant": "acme", "region": "eu"},
	}
}

// minimalEvent has only the required fields; every nullable one is null.
func minimalEvent() event.TaskEvent {
	return event.TaskEvent{EventID: "ev-2", TaskID: "task-2", Attempt: 1, OccurredAt: t0,
		Source: "s", Action: "a", Status: event.StatusOK}
}

func fullRouted() event.Routed {
	e := fullEvent()
	return event.Routed{
		Event: &e,
		Decision: event.Decision{
			Class: event.ClassRateLimited, Route: event.RouteRetry, Rule: "rate_limited.first", Reason: "429 with retry_after_ms",
			Retry:          &event.RetryPlan{N: 1, DelayMs: 1500, NotBefore: event.At(t0.Add(1500 * time.Millisecond))},
			Totals:         event.Totals{Attempts: 2, Retries: 1, CostUSD: 0.02, Tokens: 900, ElapsedMs: 4000},
			Review:         &event.Review{Owner: "operations", SLAMs: 3600000, Priority: "high"},
			Feedback:       "CODE_2101: amount must be positive",
			SuggestedModel: "gpt-4o-mini",
			UserMessage:    "We are looking into it.",
			DecidedAt:      event.At(t0.Add(time.Second)),
		},
		Input: event.Source{Topic: "ai.tasks.ingress", Partition: 3, Offset: 42, Timestamp: t0},
	}
}

// TestRoundTrip guards the wire contract: every record type, with every field
// set and with every nullable field null, decodes to the value encoded.
func TestRoundTrip(t *testing.T) {
	c := newCodec(t)
	full, min := fullEvent(), minimalEvent()
	routed := fullRouted()
	routed.Decision.Override = "acme-timeouts"
	deadLetter := event.Routed{ // undecodable input: no event, no retry, no review
		Decision: event.Decision{Class: event.ClassInvalidInput, Route: event.RouteDeadLetter, Rule: "decode", Reason: "malformed", DecidedAt: t0},
		Input:    event.Source{Topic: "ai.tasks.ingress", Offset: 7, Timestamp: t0},
	}
	minEvent := minimalEvent()
	routedMin := event.Routed{Event: &minEvent, Decision: event.Decision{Class: event.ClassSucceeded, Route: event.RouteComplete, DecidedAt: t0}}
	breaker := event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "refund-v3", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: "hallucination", Class: event.ClassHallucination, Failures: 5, Requests: 9, TaskID: "task-1", Instance: "r-1", At: t0}
	alert := event.BreakerEvent{Scope: "TASK", Key: "task-1", Kind: "ALERT", Reason: "budget", Instance: "r-1", At: t0}
	review := event.ReviewDecision{TaskID: "task-1", Approve: true, Reason: "checked", Reviewer: "li", At: t0}
	reviewMin := event.ReviewDecision{TaskID: "task-1", Reason: "no", At: t0}

	tests := []struct {
		name   string
		in     any
		encode func([]byte) ([]byte, error)
		decode func([]byte) (any, error)
	}{
		{"task_event/full", full, func(b []byte) ([]byte, error) { return c.EncodeTaskEvent(b, &full) },
			func(b []byte) (any, error) { return c.DecodeTaskEvent(b) }},
		{"task_event/nulls", min, func(b []byte) ([]byte, error) { return c.EncodeTaskEvent(b, &min) },
			func(b []byte) (any, error) { return c.DecodeTaskEvent(b) }},
		{"routed/full", routed, func(b []byte) ([]byte, error) { return c.EncodeRouted(b, &routed) },
			func(b []byte) (any, error) { return c.DecodeRouted(b) }},
		{"routed/no_event", deadLetter, func(b []byte) ([]byte, error) { return c.EncodeRouted(b, &deadLetter) },
			func(b []byte) (any, error) { return c.DecodeRouted(b) }},
		{"routed/nulls", routedMin, func(b []byte) ([]byte, error) { return c.EncodeRouted(b, &routedMin) },
			func(b []byte) (any, error) { return c.DecodeRouted(b) }},
		{"breaker/transition", breaker, func(b []byte) ([]byte, error) { return c.EncodeBreakerEvent(b, &breaker) },
			func(b []byte) (any, error) { return c.DecodeBreakerEvent(b) }},
		{"breaker/alert_nulls", alert, func(b []byte) ([]byte, error) { return c.EncodeBreakerEvent(b, &alert) },
			func(b []byte) (any, error) { return c.DecodeBreakerEvent(b) }},
		{"review/full", review, func(b []byte) ([]byte, error) { return c.EncodeReviewDecision(b, &review) },
			func(b []byte) (any, error) { return c.DecodeReviewDecision(b) }},
		{"review/nulls", reviewMin, func(b []byte) ([]byte, error) { return c.EncodeReviewDecision(b, &reviewMin) },
			func(b []byte) (any, error) { return c.DecodeReviewDecision(b) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("keep")
			b, err := tt.encode(prefix)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("keep")) {
				t.Fatalf("encode did not append to dst: % x", b[:8])
			}
			b = b[len(prefix):]
			got, err := tt.decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.in) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tt.in)
			}
			// Decode dispatches to the same value, behind a pointer.
			any, err := c.Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(reflect.ValueOf(any).Elem().Interface(), tt.in) {
				t.Fatalf("Decode: got %+v", any)
			}
		})
	}
}

// crc64Avro is the CRC-64-AVRO fingerprint of the Avro specification,
// written out here independently of goavro.
func crc64Avro(b []byte) uint64 {
	const empty = 0xc15d213aa4d7a795
	var table [256]uint64
	for i := range table {
		fp := uint64(i)
		for range 8 {
			fp = (fp >> 1) ^ (empty & -(fp & 1))
		}
		table[i] = fp
	}
	fp := uint64(empty)
	for _, c := range b {
		fp = (fp >> 8) ^ table[byte(fp)^c]
	}
	return fp
}

// wantFingerprints pins every accepted writer schema's fingerprint, as the
// Avro specification defines it; Java's SchemaNormalization and fastavro
// compute the same numbers (integration/interop checks that in CI). A change
// here is a change of the wire contract: follow avro/README.md and add a
// version.
var wantFingerprints = map[string]string{
	"faultrouter.TaskEvent/2":      "0acd1283716b068c",
	"faultrouter.TaskEvent/1":      "bf21b217ff10014d",
	"faultrouter.RoutedRecord/3":   "cfe6ae637d6f57d1",
	"faultrouter.RoutedRecord/2":   "f84e37d3a98a65b5",
	"faultrouter.RoutedRecord/1":   "ef4a753aed8bc68c",
	"faultrouter.BreakerEvent/1":   "d6cf35eefb82a0f1",
	"faultrouter.ReviewDecision/1": "93befd91180a8a1f",
	"faultrouter.TaskState/2":      "34f44b975dcefd85",
	"faultrouter.TaskState/1":      "0d454e6c458bd311",
}

// wantLegacy pins the fingerprints earlier builds wrote (goavro's
// non-standard canonical form), still accepted on read.
var wantLegacy = map[string]string{
	"faultrouter.TaskEvent/2":      "5d0bcc432a258366",
	"faultrouter.TaskEvent/1":      "a90687447f509429",
	"faultrouter.RoutedRecord/1":   "5b538e71ed324dad",
	"faultrouter.BreakerEvent/1":   "2c69021ae9021289",
	"faultrouter.ReviewDecision/1": "3d9e8d1b8e393048",
}

// TestFingerprints guards the single-object header: marker c3 01, then the
// little-endian CRC-64-AVRO of the Parsing Canonical Form, pinned per
// version; the legacy fingerprint of each version is accepted too.
func TestFingerprints(t *testing.T) {
	c := newCodec(t)
	all, err := avro.All()
	if err != nil {
		t.Fatal(err)
	}
	acc := c.Accepted()
	if len(acc) != len(wantFingerprints) || len(all) != len(acc) {
		t.Fatalf("accepted %d schemas, catalog %d, pinned %d", len(acc), len(all), len(wantFingerprints))
	}
	for i, s := range all {
		pcf, err := avro.CanonicalForm(s.JSON)
		if err != nil {
			t.Fatal(err)
		}
		fp := crc64Avro([]byte(pcf))
		key := s.Name + "/" + strconv.Itoa(s.Version)
		if got := acc[i].Fingerprint; got != wantFingerprints[key] || got != hex16(fp) {
			t.Errorf("%s: accepted %s, pinned %s, computed %s", key, got, wantFingerprints[key], hex16(fp))
		}
		if got := acc[i].Legacy; got != wantLegacy[key] {
			t.Errorf("%s: legacy %s, pinned %s", key, got, wantLegacy[key])
		}
	}
	e := minimalEvent()
	b, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex16(binary.LittleEndian.Uint64(b[2:10])); b[0] != 0xC3 || b[1] != 0x01 || got != wantFingerprints["faultrouter.TaskEvent/2"] {
		t.Fatalf("header % x", b[:10])
	}
	// The body is plain Avro binary: goavro reads it with the schema alone.
	cur, _ := avro.Current(avro.TaskEvent)
	gc, _ := goavro.NewCodec(cur.JSON)
	if _, rest, err := gc.NativeFromBinary(b[10:]); err != nil || len(rest) != 0 {
		t.Fatalf("goavro NativeFromBinary: %v, %d bytes left", err, len(rest))
	}
}

// TestLegacyFingerprints guards the records already on the topics: bytes
// written by a build before the switch to the specification's fingerprints
// (testdata/legacy, made with that build) still decode, to the values that
// build encoded.
func TestLegacyFingerprints(t *testing.T) {
	c := newCodec(t)
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("testdata", "legacy", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	breaker := event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "refund-v3", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: "hallucination", Class: event.ClassHallucination, Failures: 5, Requests: 9, TaskID: "task-1", Instance: "r-1", At: t0}
	tests := []struct {
		file, key string
		want      any
	}{
		{"task_event.v2.bin", "faultrouter.TaskEvent/2", fullEvent()},
		{"task_event.v1.bin", "faultrouter.TaskEvent/1", v1Event()},
		{"routed_record.v1.bin", "faultrouter.RoutedRecord/1", fullRouted()},
		{"breaker_event.v1.bin", "faultrouter.BreakerEvent/1", breaker},
		{"review_decision.v1.bin", "faultrouter.ReviewDecision/1",
			event.ReviewDecision{TaskID: "task-1", Approve: true, Reason: "checked", Reviewer: "li", At: t0}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b := read(tt.file)
			if got := hex16(binary.LittleEndian.Uint64(b[2:10])); got != wantLegacy[tt.key] {
				t.Fatalf("%s carries %s, not the legacy fingerprint %s", tt.file, got, wantLegacy[tt.key])
			}
			got, err := c.Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(reflect.ValueOf(got).Elem().Interface(), tt.want) {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// specSingle writes native with gc under the specification's fingerprint of
// gc's schema: the bytes of another conforming producer, which the codec's
// validation does not see.
func specSingle(gc *goavro.Codec, native any) ([]byte, error) {
	fp, err := avro.SchemaFingerprint(gc.Schema())
	if err != nil {
		return nil, err
	}
	return gc.BinaryFromNative(binary.LittleEndian.AppendUint64([]byte{0xC3, 0x01}, fp), native)
}

// specFingerprint is the specification's fingerprint of gc's schema.
func specFingerprint(t testing.TB, gc *goavro.Codec) uint64 {
	t.Helper()
	fp, err := avro.SchemaFingerprint(gc.Schema())
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func hex16(v uint64) string { return fmt.Sprintf("%016x", v) }

// TestPoison guards the dead-letter contract: each kind of bad input returns
// its sentinel and Kind, never a panic, never a value.
func TestPoison(t *testing.T) {
	c := newCodec(t)
	full := fullEvent()
	good, err := c.EncodeTaskEvent(nil, &full)
	if err != nil {
		t.Fatal(err)
	}
	routed := fullRouted()
	goodRouted, _ := c.EncodeRouted(nil, &routed)
	unknown := bytes.Clone(good)
	binary.LittleEndian.PutUint64(unknown[2:10], 0x0123456789abcdef)
	trailing := append(bytes.Clone(good), 0x00)
	noTaskID := fullEvent()
	noTaskID.TaskID = ""
	cur, _ := avro.Current(avro.TaskEvent)
	gc, _ := goavro.NewCodec(cur.JSON)
	invalid, err := specSingle(gc, taskEventNative(&noTaskID)) // valid Avro, invalid record
	if err != nil {
		t.Fatal(err)
	}
	nanCost := fullEvent()
	nanCost.Usage.CostUSD = math.NaN()
	nan, _ := specSingle(gc, taskEventNative(&nanCost))
	farFuture := taskEventNative(&full)
	farFuture["occurred_at"] = int64(math.MaxInt64) // not representable in the JSON form
	far, err := specSingle(gc, farFuture)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   []byte
		want error
		kind string
	}{
		{"empty", nil, ErrNotSingleObject, "not_single_object"},
		{"random_bytes", []byte("\x8f\x11random bytes from a broken producer"), ErrNotSingleObject, "not_single_object"},
		{"json_not_avro", []byte(`{"task_id":"t"}`), ErrNotSingleObject, "not_single_object"},
		{"header_only_short", good[:9], ErrNotSingleObject, "not_single_object"},
		{"unknown_fingerprint", unknown, ErrUnknownSchema, "unknown_schema"},
		{"truncated_body", good[:len(good)-5], ErrMalformed, "malformed"},
		{"header_without_body", good[:10], ErrMalformed, "malformed"},
		{"trailing_bytes", trailing, ErrMalformed, "malformed"},
		{"wrong_schema", goodRouted, ErrWrongSchema, "wrong_schema"},
		{"missing_task_id", invalid, ErrInvalidRecord, "invalid_record"},
		{"nan_cost", nan, ErrInvalidRecord, "invalid_record"},
		{"timestamp_out_of_range", far, ErrInvalidRecord, "invalid_record"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.DecodeTaskEvent(tt.in)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if got := Kind(err); got != tt.kind {
				t.Fatalf("Kind = %q, want %q", got, tt.kind)
			}
			if !strings.HasPrefix(err.Error(), "codec: ") {
				t.Fatalf("message %q lacks the codec: prefix", err)
			}
			if tt.want != ErrWrongSchema { // Decode accepts every record type
				if _, err := c.Decode(tt.in); !errors.Is(err, tt.want) {
					t.Fatalf("Decode err = %v, want %v", err, tt.want)
				}
			}
		})
	}
	t.Run("unknown_fingerprint_message", func(t *testing.T) {
		_, err := c.Decode(unknown)
		if !strings.Contains(err.Error(), "0123456789abcdef") {
			t.Fatalf("message %q does not name the fingerprint", err)
		}
	})
	t.Run("missing_task_id_names_field", func(t *testing.T) {
		_, err := c.DecodeTaskEvent(invalid)
		var fe *event.FieldError
		if !errors.As(err, &fe) || fe.Field != "task_id" {
			t.Fatalf("err = %v, want a FieldError for task_id", err)
		}
	})
}

// TestHugeBlockCount guards memory safety: a few bytes that announce a
// billion-item array are rejected as malformed without allocating for them.
func TestHugeBlockCount(t *testing.T) {
	c := newCodec(t)
	e := minimalEvent()
	e.Output = &event.Output{Flags: []string{"a"}}
	b, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	// The flags block count 1 is zig-zag 0x02 followed by "\x02a" and the
	// end-of-array 0x00; replace the count with 2^30.
	i := bytes.Index(b, []byte{0x02, 0x02, 'a', 0x00})
	if i < 0 {
		t.Fatalf("flags not found in % x", b)
	}
	huge := append(bytes.Clone(b[:i]), 0x80, 0x80, 0x80, 0x80, 0x08)
	huge = append(huge, b[i+1:]...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = c.DecodeTaskEvent(huge)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
	if !strings.Contains(err.Error(), "MaxBlockCount") {
		t.Fatalf("err = %v, want the block-count bound", err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
		t.Fatalf("decoding allocated %d bytes", grown)
	}
}

// TestEncodeRejects guards the producer side: an invalid TaskEvent or a
// decision with a class outside the enum is never written.
func TestEncodeRejects(t *testing.T) {
	c := newCodec(t)
	e := fullEvent()
	e.Attempt = 0
	if b, err := c.EncodeTaskEvent([]byte("x"), &e); !errors.Is(err, ErrInvalidRecord) || string(b) != "x" {
		t.Fatalf("EncodeTaskEvent = %q, %v; want dst unchanged and ErrInvalidRecord", b, err)
	}
	r := fullRouted()
	r.Decision.Class = "NOT_A_CLASS"
	if b, err := c.EncodeRouted([]byte("x"), &r); err == nil || string(b) != "x" {
		t.Fatalf("EncodeRouted = %q, %v; want dst unchanged and an error", b, err)
	}
}

// TestEnumsMatchGo guards the one-to-one mapping of JSON, Go and Avro: the
// Avro enums hold exactly the Go enum values, in the same order.
func TestEnumsMatchGo(t *testing.T) {
	c := newCodec(t)
	check := func(name string, want []string) {
		set := c.view.enums[name]
		if len(set.symbols) != len(want) {
			t.Errorf("%s: %d symbols, Go has %d", name, len(set.symbols), len(want))
		}
		for _, w := range want {
			if !set.symbols[w] {
				t.Errorf("%s lacks %s", name, w)
			}
		}
	}
	check("faultrouter.Stage", strs(event.Stages))
	check("faultrouter.Status", strs(event.Statuses))
	check("faultrouter.OpKind", strs(event.OpKinds))
	check("faultrouter.OpState", strs(event.OpStates))
	check("faultrouter.Class", strs(event.Classes))
	check("faultrouter.Route", strs(event.Routes))
}

func strs[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// TestKind guards the dead-letter header values for wrapped errors.
func TestKind(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("other"), "error"},
		{errors.Join(errors.New("ctx"), ErrUnknownSchema), "unknown_schema"},
	} {
		if got := Kind(tt.err); got != tt.want {
			t.Errorf("Kind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
