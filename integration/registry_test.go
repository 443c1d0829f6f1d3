package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// The Confluent wire format through a real schema registry: Apicurio
// Registry's Confluent-compatible API, started by registry.sh. make test
// exports its URL as FAULTROUTER_TEST_REGISTRY (and FAULTROUTER_REQUIRE_REGISTRY=1);
// each test's subjects carry the test's topic prefix.

// registryURL returns the test registry's URL, or skips the test when none
// was started (a run by hand without registry.sh).
func registryURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("FAULTROUTER_TEST_REGISTRY")
	if u == "" {
		if os.Getenv("FAULTROUTER_REQUIRE_REGISTRY") != "" {
			t.Fatal("FAULTROUTER_REQUIRE_REGISTRY is set but FAULTROUTER_TEST_REGISTRY is empty")
		}
		t.Skip("no schema registry: FAULTROUTER_TEST_REGISTRY unset (make test starts one with integration/registry.sh)")
	}
	return u
}

// newRegistryEnv is an env whose commands all reach the registry.
func newRegistryEnv(t *testing.T) (*env, string) {
	url := registryURL(t)
	e := newEnv(t)
	e.vars = append(e.vars, "FAULTROUTER_REGISTRY_URL="+url)
	return e, url
}

// subjectID returns the ID of the latest version of a subject.
func subjectID(t *testing.T, url, subject string) int {
	t.Helper()
	var v struct {
		ID int `json:"id"`
	}
	registryDo(t, http.MethodGet, url+"/subjects/"+subject+"/versions/latest", nil, &v)
	return v.ID
}

// registerRaw registers a schema under a subject directly over HTTP, as a
// producer that bypasses schemas check would, and returns its ID.
func registerRaw(t *testing.T, url, subject, schema string) int {
	t.Helper()
	var v struct {
		ID int `json:"id"`
	}
	body, _ := json.Marshal(map[string]string{"schema": schema})
	registryDo(t, http.MethodPost, url+"/subjects/"+subject+"/versions", body, &v)
	return v.ID
}

func registryDo(t *testing.T, method, url string, body []byte, into any) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("%s %s: %v: %s", method, url, err, b)
	}
}

// evolvedTaskEvent returns the current TaskEvent schema with edit applied to
// its parsed field list.
func evolvedTaskEvent(t *testing.T, edit func([]any) []any) string {
	t.Helper()
	cur, err := avro.Current(avro.TaskEvent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(cur.JSON), &m); err != nil {
		t.Fatal(err)
	}
	m["fields"] = edit(m["fields"].([]any))
	b, _ := json.Marshal(m)
	return string(b)
}

// withPriority is TaskEvent with a new optional field: a compatible change.
func withPriority(fs []any) []any {
	return append(fs, map[string]any{"name": "priority", "type": []any{"null", "string"}, "default": nil})
}

// attemptAsString is TaskEvent with attempt retyped: an incompatible change.
func attemptAsString(fs []any) []any {
	for _, f := range fs {
		if fm := f.(map[string]any); fm["name"] == "attempt" {
			fm["type"] = "string"
		}
	}
	return fs
}

// timeoutEvent is a network timeout on its first attempt: routed RETRY.
func timeoutEvent(task string) event.TaskEvent {
	return event.TaskEvent{EventID: task + "-e1", TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "registry-test", Action: "summarize", Stage: event.StageNetwork, Status: event.StatusError,
		Error: &event.Error{Type: "TimeoutError"}}
}

// confluentRecord encodes e with the writer schema text, edited by change
// (nil: none), in the Confluent wire format with the schema ID id.
func confluentRecord(t *testing.T, schema string, id int, e event.TaskEvent, change func(map[string]any)) []byte {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	so, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := avro.Current(avro.TaskEvent)
	cc, _ := goavro.NewCodec(cur.JSON)
	native, _, err := cc.NativeFromBinary(so[10:])
	if err != nil {
		t.Fatal(err)
	}
	m := native.(map[string]any)
	if change != nil {
		change(m)
	}
	wc, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	v := []byte{0, byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}
	v, err = wc.BinaryFromNative(v, m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func produceRaw(t *testing.T, topic, key string, value []byte) {
	t.Helper()
	cl := kafkaClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// rawValues returns the values of a topic's records keyed by key.
func rawValues(t *testing.T, topic, key string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out [][]byte
	for _, r := range readTopic(ctx, t, topic, true) {
		if string(r.Key) == key {
			out = append(out, r.Value)
		}
	}
	return out
}

// Guards the Confluent wire format end to end: a TaskEvent produced by
// `faultrouter produce --wire-format confluent` (its schema registered under
// <prefix>ai.tasks.ingress-value) is routed by a router reading through the
// registry, and the router's audit and retry records are in the Confluent
// format with the IDs of RoutedRecord under their topics' subjects; tail and
// replay read them; a review decision written by `review decide
// --wire-format confluent` is routed.
func TestRegistryConfluentRouted(t *testing.T) {
	e, url := newRegistryEnv(t)
	e.cli("", "schemas", "register", "--compatibility", "BACKWARD")
	e.startRouter("a", t.TempDir(), "--wire-format", "confluent")
	ev := timeoutEvent("t-sr-1")
	line, _ := json.Marshal(&ev)
	e.cli(string(line)+"\n", "produce", "--wire-format", "confluent")

	in := rawValues(t, e.prefix+"ai.tasks.ingress", ev.TaskID)
	if id, ok := codec.ConfluentID(in[0]); !ok || int(id) != subjectID(t, url, e.prefix+"ai.tasks.ingress-value") {
		t.Fatalf("produce wrote % x, want 00 and the ID of the ingress subject", in[0][:5])
	}
	audit := byTask(e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, ev.TaskID)) > 0 }), ev.TaskID)
	if len(audit) != 1 || str(audit[0], "decision.class")+"/"+str(audit[0], "decision.route") != "NETWORK_TIMEOUT/RETRY" {
		t.Fatalf("audit for %s: %v, want one NETWORK_TIMEOUT/RETRY", ev.TaskID, audit)
	}
	for _, topic := range []string{"ai.tasks.audit", "ai.tasks.retry"} {
		want := subjectID(t, url, e.prefix+topic+"-value")
		var vs [][]byte
		waitFor(30*time.Second, func() bool { vs = rawValues(t, e.prefix+topic, ev.TaskID); return len(vs) > 0 })
		if len(vs) == 0 {
			t.Fatalf("nothing on %s for %s", topic, ev.TaskID)
		}
		if id, ok := codec.ConfluentID(vs[0]); !ok || int(id) != want {
			t.Fatalf("%s record starts % x, want 00 and ID %d", topic, vs[0][:5], want)
		}
	}
	if out := e.cli("", "replay", "--topic", "audit", "--task", ev.TaskID); !strings.Contains(out, "NETWORK_TIMEOUT") {
		t.Fatalf("replay of the Confluent-framed audit record: %s", out)
	}

	// a reviewer's decision in the Confluent wire format is read too
	e.cli("", "review", "decide", "--task", ev.TaskID, "--reject", "--reason", "registry test", "--wire-format", "confluent")
	dec := rawValues(t, e.prefix+"ai.tasks.review.decisions", ev.TaskID)
	if id, ok := codec.ConfluentID(dec[0]); len(dec) != 1 || !ok || int(id) != subjectID(t, url, e.prefix+"ai.tasks.review.decisions-value") {
		t.Fatalf("review decide wrote % x, want 00 and the ID of the decisions subject", dec[0][:5])
	}
	audit = byTask(e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, ev.TaskID)) > 1 }), ev.TaskID)
	if len(audit) != 2 || str(audit[1], "decision.class") == "INVALID_INPUT" {
		t.Fatalf("audit after the review decision: %v, want the decision routed", audit)
	}
	if dl := e.tailNow("deadletter"); len(dl) != 0 {
		t.Fatalf("dead-lettered: %v", dl)
	}
}

// Guards schema evolution through the registry: a TaskEvent schema with a
// new optional field passes `schemas check` and its records are routed; a
// schema with attempt retyped is refused by `schemas check` and by the
// registry on `schemas register` (exit 1, naming attempt), and a record written with it anyway (registered under another
// subject, so the registry holds it) is dead-lettered with the error kind
// unresolvable_schema, as is a record with an ID the registry does not know.
func TestRegistrySchemaEvolution(t *testing.T) {
	e, url := newRegistryEnv(t)
	e.cli("", "schemas", "register", "--compatibility", "BACKWARD")
	e.startRouter("a", t.TempDir())
	dir := t.TempDir()
	good, bad := evolvedTaskEvent(t, withPriority), evolvedTaskEvent(t, attemptAsString)
	goodFile, badFile := filepath.Join(dir, "good.avsc"), filepath.Join(dir, "bad.avsc")
	os.WriteFile(goodFile, []byte(good), 0o644)
	os.WriteFile(badFile, []byte(bad), 0o644)

	if out := e.cli("", "schemas", "check", "--topic", "ingress", "--file", goodFile); !strings.Contains(out, "compatible   "+e.prefix+"ai.tasks.ingress-value (level BACKWARD)") {
		t.Fatalf("schemas check of a new optional field: %s", out)
	}
	out, errOut, err := e.tryCLI("", "schemas", "check", "--topic", "ingress", "--file", badFile)
	var exit *exec.ExitError
	if err == nil || !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "field attempt") {
		t.Fatalf("schemas check of attempt as string: err %v, stdout %q, stderr %q; want exit 1 naming field attempt", err, out, errOut)
	}
	out, errOut, err = e.tryCLI("", "schemas", "register", "--topic", "ingress", "--file", badFile)
	if err == nil || !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "field attempt") {
		t.Fatalf("schemas register of attempt as string: err %v, stdout %q, stderr %q; want the registry's refusal naming field attempt", err, out, errOut)
	}

	e.cli("", "schemas", "register", "--topic", "ingress", "--file", goodFile)
	goodID := subjectID(t, url, e.prefix+"ai.tasks.ingress-value")
	badID := registerRaw(t, url, e.prefix+"scratch-value", bad)
	ingress := e.prefix + "ai.tasks.ingress"
	produceRaw(t, ingress, "t-evolved", confluentRecord(t, good, goodID, timeoutEvent("t-evolved"),
		func(m map[string]any) { m["priority"] = map[string]any{"string": "high"} }))
	produceRaw(t, ingress, "t-bad", confluentRecord(t, bad, badID, timeoutEvent("t-bad"),
		func(m map[string]any) { m["attempt"] = "1" }))
	unknown := confluentRecord(t, good, goodID, timeoutEvent("t-unknown"), nil)
	unknown[1], unknown[2], unknown[3], unknown[4] = 0x7f, 0xff, 0xff, 0xf0
	produceRaw(t, ingress, "t-unknown", unknown)

	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(r) >= 3 })
	if got := byTask(audit, "t-evolved"); len(got) != 1 || str(got[0], "decision.route") != "RETRY" {
		t.Fatalf("the evolved schema's record: %v, want routed RETRY", got)
	}
	dl := e.tailNow("deadletter")
	kinds := map[string]string{}
	for _, r := range dl {
		b, _ := json.Marshal(r)
		switch {
		case strings.Contains(string(b), "t-bad"):
			kinds["t-bad"] = string(b)
		case strings.Contains(string(b), "t-unknown"):
			kinds["t-unknown"] = string(b)
		}
	}
	if !strings.Contains(kinds["t-bad"], "unresolvable_schema") || !strings.Contains(kinds["t-bad"], "field attempt") {
		t.Fatalf("the incompatible record's dead letter: %q, want kind unresolvable_schema naming field attempt (all: %v)", kinds["t-bad"], dl)
	}
	if !strings.Contains(kinds["t-unknown"], "unknown_schema") {
		t.Fatalf("the unknown ID's dead letter: %q, want kind unknown_schema (all: %v)", kinds["t-unknown"], dl)
	}
	if len(dl) != 2 {
		t.Fatalf("dead letters: %v, want the two bad records only", dl)
	}
}

// Guards a registry outage: it is not the records' fault. With the
// registry stopped, a record whose schema ID the router has not cached is
// neither routed nor dead-lettered; the router reports not ready and
// faultrouter_registry_waiting 1; when the registry is back the record is
// routed, an alert of scope REGISTRY on the alerts topic says how long
// routing waited, and the router is ready again, with nothing dead-lettered.
func TestRegistryOutage(t *testing.T) {
	e, url := newRegistryEnv(t)
	e.cli("", "schemas", "register", "--compatibility", "BACKWARD")
	dir := t.TempDir()
	good := evolvedTaskEvent(t, withPriority)
	goodFile := filepath.Join(dir, "good.avsc")
	os.WriteFile(goodFile, []byte(good), 0o644)
	e.cli("", "schemas", "register", "--topic", "ingress", "--file", goodFile)
	goodID := subjectID(t, url, e.prefix+"ai.tasks.ingress-value")
	r := e.startRouter("a", t.TempDir(), "--wire-format", "confluent")

	registryScript(t, "halt")
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			registryScript(t, "start")
		}
	})
	produceRaw(t, e.prefix+"ai.tasks.ingress", "t-outage", confluentRecord(t, good, goodID, timeoutEvent("t-outage"), nil))
	if !waitFor(60*time.Second, func() bool { return !httpOK(r.metrics + "/readyz") }) {
		t.Fatalf("the router stayed ready with the registry down; logs:\n%s", r.logs.String())
	}
	if m := metricsText(t, r.metrics); !strings.Contains(m, "faultrouter_registry_waiting 1") {
		t.Fatalf("faultrouter_registry_waiting is not 1 while the registry is down")
	}
	if a := byTask(e.tailNow("audit"), "t-outage"); len(a) != 0 {
		t.Fatalf("routed while the registry was down: %v", a)
	}
	if dl := e.tailNow("deadletter"); len(dl) != 0 {
		t.Fatalf("dead-lettered while the registry was down: %v", dl)
	}

	registryScript(t, "start")
	restarted = true
	audit := byTask(e.tailUntil("audit", 90*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-outage")) > 0 }), "t-outage")
	if len(audit) != 1 || str(audit[0], "decision.route") != "RETRY" {
		t.Fatalf("after the registry returned: %v, want the record routed RETRY; logs:\n%s", audit, r.logs.String())
	}
	if !waitFor(30*time.Second, func() bool { return httpOK(r.metrics + "/readyz") }) {
		t.Fatal("the router is not ready again after the registry returned")
	}
	alerted := false
	for _, a := range e.tailNow("alerts") {
		alerted = alerted || (str(a, "scope") == "REGISTRY" && strings.Contains(str(a, "reason"), "did not answer"))
	}
	if !alerted {
		t.Fatalf("no REGISTRY alert on the alerts topic: %v", e.tailNow("alerts"))
	}
	if dl := e.tailNow("deadletter"); len(dl) != 0 {
		t.Fatalf("dead-lettered: %v", dl)
	}
}

// registryScript runs registry.sh with the environment make test gave it.
func registryScript(t *testing.T, verb string) {
	t.Helper()
	cmd := exec.Command("./registry.sh", verb)
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("registry.sh %s: %v\n%s", verb, err, errOut.String())
	}
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Guards the Python package on a schema registry: its router suite, run
// with FAULTROUTER_REGISTRY_URL, writes its events and review decisions with
// confluent-kafka's AvroSerializer and reads the router's audit, retry and
// review records with its AvroDeserializer, against a router writing the
// Confluent wire format; nothing it sent is invalid.
func TestPythonWorkerRegistry(t *testing.T) {
	e, _ := newRegistryEnv(t)
	e.cli("", "schemas", "register", "--compatibility", "BACKWARD")
	r := e.startRouter("a", t.TempDir(), "--wire-format", "confluent")
	pythonWorkerSuite(t, e, r)
}

// Guards a Java worker on a schema registry: a KafkaProducer with Apicurio
// Registry's AvroKafkaSerializer (integration/java/src/RegistryProduce.java)
// registers avro/'s TaskEvent under <topic>-value itself and writes the
// Confluent wire format; the router reads it through the registry and
// routes it, and nothing is dead-lettered.
func TestJavaRegistrySerde(t *testing.T) {
	e, url := newRegistryEnv(t)
	r := e.startRouter("a", t.TempDir())
	cp := interop(t, "FAULTROUTER_JAVA_CP", "java")
	const task = "t-java-serde"
	api := strings.Replace(url, "/apis/ccompat/v7", "/apis/registry/v3", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", "-cp", cp, "RegistryProduce", brokers, api, "../avro", e.prefix+"ai.tasks.ingress", task, "java-serde-e-1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("java RegistryProduce: %v\n%s", err, out)
	}
	in := rawValues(t, e.prefix+"ai.tasks.ingress", task)
	if len(in) != 1 {
		t.Fatalf("%d records on ingress for %s, want 1", len(in), task)
	}
	if _, ok := codec.ConfluentID(in[0]); !ok {
		t.Fatalf("Apicurio's serde wrote % x, not the Confluent wire format", in[0][:min(len(in[0]), 5)])
	}
	audit := byTask(e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, task)) > 0 }), task)
	if len(audit) != 1 || str(audit[0], "decision.class")+"/"+str(audit[0], "decision.route") != "NETWORK_TIMEOUT/RETRY" ||
		str(audit[0], "attributes.client") != "java-apicurio-serde" {
		t.Fatalf("audit for %s: %v, want the Java event routed NETWORK_TIMEOUT/RETRY; logs:\n%s", task, audit, r.logs.String())
	}
	if dl := e.tailNow("deadletter"); len(dl) != 0 {
		t.Fatalf("dead-lettered: %v", dl)
	}
}
