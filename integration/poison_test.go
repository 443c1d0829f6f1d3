package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// kafkaClient returns a plain franz-go client on the test broker, closed at
// the end of the test; it produces raw bytes the CLI would never write.
func kafkaClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// validEvent returns a TaskEvent that routes SUCCEEDED/COMPLETE.
func validEvent(eventID, taskID string) *event.TaskEvent {
	valid, conf := true, 0.93
	return &event.TaskEvent{
		EventID: eventID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "it", Action: "answer_ticket", Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3",
		Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "Your refund was issued.", SchemaValid: &valid, Confidence: &conf},
		Usage:  event.Usage{CostUSD: 0.01, Tokens: 100, ElapsedMs: 500},
	}
}

func encodeEvent(t *testing.T, c *codec.Codec, e *event.TaskEvent) []byte {
	t.Helper()
	v, err := c.EncodeTaskEvent(nil, e)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// withoutTaskID re-encodes a valid single-object TaskEvent with an empty
// task_id: well-formed Avro under the current schema's fingerprint that fails
// the TaskEvent contract. The codec refuses to write such a record, so this
// goes through goavro directly.
func withoutTaskID(t *testing.T, valid []byte) []byte {
	t.Helper()
	s, err := avro.Current(avro.TaskEvent)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := goavro.NewCodec(s.JSON)
	if err != nil {
		t.Fatal(err)
	}
	native, rest, err := gc.NativeFromBinary(valid[10:])
	if err != nil || len(rest) != 0 {
		t.Fatalf("decoding our own TaskEvent: %v (%d bytes left)", err, len(rest))
	}
	m := native.(map[string]any)
	m["task_id"] = ""
	out, err := gc.BinaryFromNative(bytes.Clone(valid[:10]), m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// deadLetterOf returns the dead-letter objects tail printed for the input
// record at topic/partition/offset.
func deadLetterOf(recs []map[string]any, topic string, partition int32, offset int64) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		// the header names contain dots, so they are read from the map
		h, _ := get(r, "headers").(map[string]any)
		if h["faultrouter.error.topic"] == topic &&
			h["faultrouter.error.partition"] == strconv.Itoa(int(partition)) &&
			h["faultrouter.error.offset"] == strconv.FormatInt(offset, 10) {
			out = append(out, r)
		}
	}
	return out
}

// auditOf returns the audit records of the input record at topic/partition/offset.
func auditOf(recs []map[string]any, topic string, partition int32, offset int64) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		p, _ := get(r, "input.partition").(float64)
		o, _ := get(r, "input.offset").(float64)
		if str(r, "input.topic") == topic && int32(p) == partition && int64(o) == offset {
			out = append(out, r)
		}
	}
	return out
}

// Guards the poison-input contract on the real broker: random bytes,
// truncated Avro, an unknown schema fingerprint, an empty key, a missing
// task_id, a key that differs from task_id and a record over the configured
// maximum size each go to the dead-letter topic with their original bytes and
// the faultrouter.error.* headers, get exactly one audit record
// (INVALID_INPUT/DEADLETTER), are counted in
// faultrouter_deadlettered_input_total{kind}, and routing goes on: a valid
// event produced after all of them is routed SUCCEEDED/COMPLETE.
func TestPoisonInputIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	rt := e.startRouter("a", t.TempDir(), "--max-record-bytes", "2048")
	ingress := e.prefix + "ai.tasks.ingress"

	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	valid := encodeEvent(t, c, validEvent("p-valid-src", "t-poison-src"))
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = byte(rand.IntN(256))
	}
	garbage[0] = 0x42 // never the single-object marker 0xC3
	unknownFP := []byte{0xC3, 0x01}
	for range 8 {
		unknownFP = append(unknownFP, byte(rand.IntN(256)))
	}
	unknownFP = append(unknownFP, valid[10:]...)
	big := validEvent("p-big", "t-big")
	big.Output.Text = strings.Repeat("x", 4096)
	bigValue := encodeEvent(t, c, big)
	if len(bigValue) <= 4096 {
		t.Fatalf("oversize value is only %d bytes", len(bigValue))
	}

	cases := []struct {
		name  string
		key   []byte
		value []byte
		kind  string
		stage string
	}{
		{"random_bytes", []byte("t-garbage"), garbage, "not_single_object", "decode"},
		{"truncated_avro", []byte("t-poison-src"), valid[:len(valid)/2], "malformed", "decode"},
		{"unknown_fingerprint", []byte("t-poison-src"), unknownFP, "unknown_schema", "decode"},
		{"empty_key", nil, encodeEvent(t, c, validEvent("p-nokey", "t-nokey")), "empty_key", "validate"},
		{"missing_task_id", []byte("t-no-task-id"), withoutTaskID(t, valid), "invalid_record", "validate"},
		{"key_mismatch", []byte("t-other"), encodeEvent(t, c, validEvent("p-mismatch", "t-mismatch")), "key_mismatch", "validate"},
		{"oversize", []byte("t-big"), bigValue, "oversize", "validate"},
	}
	cl := kafkaClient(t, kgo.DefaultProduceTopic(ingress))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	produced := make([]*kgo.Record, len(cases))
	for i, tc := range cases {
		produced[i] = &kgo.Record{Key: tc.key, Value: tc.value}
	}
	if err := cl.ProduceSync(ctx, produced...).FirstErr(); err != nil {
		t.Fatalf("produce poison: %v", err)
	}
	after := &kgo.Record{Key: []byte("t-after-poison"), Value: encodeEvent(t, c, validEvent("p-after", "t-after-poison"))}
	if err := cl.ProduceSync(ctx, after).FirstErr(); err != nil {
		t.Fatalf("produce valid event: %v", err)
	}

	want := len(cases) + 1
	audit := e.tailUntil("audit", 90*time.Second, func(r []map[string]any) bool { return len(r) >= want })
	if len(audit) != want {
		t.Fatalf("audit has %d records, want %d (one per input); router logs:\n%s", len(audit), want, rt.logs.String())
	}
	dl := e.tailUntil("deadletter", 30*time.Second, func(r []map[string]any) bool { return len(r) >= len(cases) })
	if len(dl) != len(cases) {
		t.Errorf("deadletter has %d records, want %d (one per poison record)", len(dl), len(cases))
	}
	var metrics string
	waitFor(30*time.Second, func() bool {
		metrics, _ = httpGet(rt.metrics + "/metrics")
		_, ok := metricValue(metrics, `faultrouter_deadlettered_input_total{kind="oversize"}`)
		return ok
	})

	for i, tc := range cases {
		rec := produced[i]
		t.Run(tc.name, func(t *testing.T) {
			dls := deadLetterOf(dl, ingress, rec.Partition, rec.Offset)
			if len(dls) != 1 {
				t.Fatalf("%d dead-letter records for %s/%d@%d, want 1; deadletter: %v", len(dls), ingress, rec.Partition, rec.Offset, dl)
			}
			d := dls[0]
			got, err := base64.StdEncoding.DecodeString(str(d, "value_base64"))
			if err != nil || !bytes.Equal(got, tc.value) {
				t.Errorf("dead-letter value differs from the original bytes (%d bytes, want %d; err %v)", len(got), len(tc.value), err)
			}
			if str(d, "key") != string(tc.key) {
				t.Errorf("dead-letter key %q, want the original %q", str(d, "key"), tc.key)
			}
			h, _ := get(d, "headers").(map[string]any)
			wantHdr := map[string]string{
				"faultrouter.error.topic":     ingress,
				"faultrouter.error.partition": strconv.Itoa(int(rec.Partition)),
				"faultrouter.error.offset":    strconv.FormatInt(rec.Offset, 10),
				"faultrouter.error.timestamp": strconv.FormatInt(rec.Timestamp.UnixMilli(), 10),
				"faultrouter.error.stage":     tc.stage,
				"faultrouter.error.kind":      tc.kind,
			}
			for k, v := range wantHdr {
				if h[k] != v {
					t.Errorf("header %s = %v, want %s", k, h[k], v)
				}
			}
			if msg, _ := h["faultrouter.error.message"].(string); msg == "" {
				t.Errorf("header faultrouter.error.message is empty")
			}
			if str(d, "error_kind") != tc.kind {
				t.Errorf("tail error_kind %q, want %q", str(d, "error_kind"), tc.kind)
			}

			as := auditOf(audit, ingress, rec.Partition, rec.Offset)
			if len(as) != 1 {
				t.Fatalf("%d audit records for %s/%d@%d, want exactly 1", len(as), ingress, rec.Partition, rec.Offset)
			}
			if got := str(as[0], "decision.class") + "/" + str(as[0], "decision.route"); got != "INVALID_INPUT/DEADLETTER" {
				t.Errorf("audit decision %s, want INVALID_INPUT/DEADLETTER", got)
			}
			if rule := str(as[0], "decision.rule"); rule != "input."+tc.kind {
				t.Errorf("audit rule %q, want input.%s", rule, tc.kind)
			}

			sample := fmt.Sprintf(`faultrouter_deadlettered_input_total{kind=%q}`, tc.kind)
			if v, ok := metricValue(metrics, sample); !ok || v != 1 {
				t.Errorf("%s = %v (present %v), want 1", sample, v, ok)
			}
		})
	}

	t.Run("routing_goes_on", func(t *testing.T) {
		as := auditOf(audit, ingress, after.Partition, after.Offset)
		if len(as) != 1 {
			t.Fatalf("%d audit records for the valid event after the poison, want 1", len(as))
		}
		if got := str(as[0], "decision.class") + "/" + str(as[0], "decision.route"); got != "SUCCEEDED/COMPLETE" || str(as[0], "task_id") != "t-after-poison" {
			t.Errorf("valid event after the poison: %s for task %q, want SUCCEEDED/COMPLETE for t-after-poison", got, str(as[0], "task_id"))
		}
	})
}

// Guards the topic check: `faultrouter topics check` against the real
// broker passes after `run` has created the topics.
func TestTopicsCheckAfterRun(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	out := e.cli("", "topics", "check", "--partitions", "3")
	if !strings.HasPrefix(out, "ok: ") {
		t.Fatalf("topics check printed %q, want a line starting with \"ok: \"", out)
	}
}

// Guards the start-up check: `run` refuses to start, with one clear
// message naming the topic and the setting, when an existing topic
// contradicts its spec (here a state changelog that is not compacted).
func TestRunRefusesContradictingTopic(t *testing.T) {
	e := newEnv(t)
	state := e.prefix + "faultrouter.state"
	adm := kadm.NewClient(kafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	policy := "delete"
	resp, err := adm.CreateTopic(ctx, 3, 1, map[string]*string{"cleanup.policy": &policy}, state)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s: %v", state, err)
	}

	out, errOut, err := e.tryCLI("", "run", "--state-dir", t.TempDir(), "--instance-id", "a",
		"--group", e.prefix+"router", "--partitions", "3", "--metrics-addr", "")
	if err == nil {
		t.Fatalf("run started although %s has cleanup.policy=delete; stdout:\n%s\nstderr:\n%s", state, out, errOut)
	}
	if !strings.Contains(errOut, "refusing to start") || !strings.Contains(errOut, state) || !strings.Contains(errOut, "cleanup.policy") {
		t.Errorf("run's message does not name the refusal, the topic %s and cleanup.policy:\n%s", state, errOut)
	}
	if n := strings.Count(errOut, "refusing to start"); n != 1 {
		t.Errorf("run printed %d refusals, want one message:\n%s", n, errOut)
	}
}

// Guards the tail contract: a record that does not decode is printed
// as an error object with its offset, and tailing goes on to the next record.
func TestTailPrintsUndecodableAndGoesOn(t *testing.T) {
	e := newEnv(t)
	e.cli("", "topics", "apply", "--partitions", "3")
	review := e.prefix + "ai.tasks.review"
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	ev := validEvent("tail-1", "t-tail")
	v, err := c.EncodeRouted(nil, &event.Routed{
		Event:    ev,
		Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Rule: "it", Reason: "it", DecidedAt: event.At(time.Now())},
		Input:    event.Source{Topic: e.prefix + "ai.tasks.ingress", Offset: 7, Timestamp: event.At(time.Now())},
	})
	if err != nil {
		t.Fatal(err)
	}
	cl := kafkaClient(t, kgo.DefaultProduceTopic(review), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := &kgo.Record{Key: []byte("t-tail"), Value: []byte("\x00\x01 not avro at all")}
	good := &kgo.Record{Key: []byte("t-tail"), Value: v}
	if err := cl.ProduceSync(ctx, bad, good).FirstErr(); err != nil {
		t.Fatal(err)
	}

	recs := e.tail("review", 2*time.Second)
	if len(recs) != 2 {
		t.Fatalf("tail printed %d records, want 2 (the error, then the valid record): %v", len(recs), recs)
	}
	if str(recs[0], "error_kind") == "" || str(recs[0], "error") == "" {
		t.Errorf("first line is not an error object: %v", recs[0])
	}
	if off, ok := get(recs[0], "offset").(float64); !ok || int64(off) != bad.Offset {
		t.Errorf("error object offset %v, want %d", get(recs[0], "offset"), bad.Offset)
	}
	if str(recs[1], "task_id") != "t-tail" || str(recs[1], "decision.class") != "MODEL_REFUSAL" {
		t.Errorf("second line is not the valid review record: %v", recs[1])
	}
}

// Guards the produce contract: every line is validated before anything
// is sent; one bad line (a misspelled field) sends nothing and the message
// names the line and the field.
func TestProduceValidatesEveryLineFirst(t *testing.T) {
	e := newEnv(t)
	e.cli("", "topics", "apply", "--partitions", "3")
	good1 := taskEvent("pv-1", "t-pv-1", 1, okFields)
	bad := strings.Replace(taskEvent("pv-2", "t-pv-2", 1, okFields), `"attempt"`, `"attempts"`, 1)
	good3 := taskEvent("pv-3", "t-pv-3", 1, okFields)
	file := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(file, []byte(good1+bad+good3), 0o644); err != nil {
		t.Fatal(err)
	}

	out, errOut, err := e.tryCLI("", "produce", "--topic", "ingress", "--file", file)
	if err == nil {
		t.Fatalf("produce accepted a file with a misspelled field; stdout:\n%s", out)
	}
	if !strings.Contains(errOut, "line 2") || !strings.Contains(errOut, "attempts") {
		t.Errorf("produce's message does not name line 2 and the field \"attempts\":\n%s", errOut)
	}
	if recs := e.tail("ingress", 2*time.Second); len(recs) != 0 {
		t.Fatalf("ingress has %d records after a refused produce, want none: %v", len(recs), recs)
	}

	// the same tail does see records once the file is good
	e.cli(good1+good3, "produce", "--topic", "ingress")
	if recs := e.tailUntil("ingress", 30*time.Second, func(r []map[string]any) bool { return len(r) >= 2 }); len(recs) != 2 {
		t.Fatalf("ingress has %d records after producing 2 good lines, want 2", len(recs))
	}
}
