package integration

import (
	"bufio"
	"context"
	bin "encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/avro"
)

// The wire format as other languages see it: Java Avro and fastavro, each
// loading ../avro the way its users would. interop.sh prepares both (cached);
// make test exports what it printed as FAULTROUTER_JAVA_CP and
// FAULTROUTER_PYTHON, and a test run by hand calls interop.sh itself.

func interop(t *testing.T, env, what string) string {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	cmd := exec.Command("./interop.sh", what)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("interop.sh %s: %v", what, err)
	}
	return strings.TrimSpace(string(out))
}

// javaCheck runs integration/java's WireCheck with Java Avro.
func javaCheck(t *testing.T, args ...string) string {
	t.Helper()
	cp := interop(t, "FAULTROUTER_JAVA_CP", "java")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", append([]string{"-cp", cp, "WireCheck"}, args...)...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("java WireCheck %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return string(out)
}

// fingerprintLines parses "file<TAB>full name<TAB>hex fingerprint" lines into
// file -> "name hex".
func fingerprintLines(t *testing.T, out string) map[string]string {
	t.Helper()
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			t.Fatalf("unexpected line %q", sc.Text())
		}
		got[f[0]] = f[1] + " " + f[2]
	}
	return got
}

// Guards the wire contract's fingerprints: for every schema file faultrouter
// accepts, Java Avro's SchemaNormalization.parsingFingerprint64 and fastavro's
// CRC-64-AVRO fingerprint of the Parsing Canonical Form are the number in
// faultrouter's catalog, the one its codec writes.
func TestFingerprintsMatchJavaAndFastavro(t *testing.T) {
	all, err := avro.All()
	if err != nil {
		t.Fatal(err)
	}
	python := interop(t, "FAULTROUTER_PYTHON", "python")
	pyOut, err := exec.Command(python, "-m", "faultrouter", "fingerprints", "../avro").Output()
	if err != nil {
		t.Fatalf("fastavro fingerprints: %v", err)
	}
	for lib, got := range map[string]map[string]string{
		"Java Avro": fingerprintLines(t, javaCheck(t, "fingerprints", "../avro")),
		"fastavro":  fingerprintLines(t, string(pyOut)),
	} {
		if len(got) != len(all) {
			t.Errorf("%s computed %d fingerprints, the catalog has %d: %v", lib, len(got), len(all), got)
		}
		for _, s := range all {
			want := fmt.Sprintf("%s %016x", s.Name, s.Fingerprint)
			if got[s.File] != want {
				t.Errorf("%s: %s says %q, faultrouter %q", s.File, lib, got[s.File], want)
			}
		}
	}
}

// Guards the wire format end to end with Java's standard single-object
// encoder and decoder: a TaskEvent written by Java Avro's BinaryMessageEncoder
// is routed by the router (a network timeout, retried), not dead-lettered, and
// the router's audit record for it is read by Java's BinaryMessageDecoder.
func TestJavaWireFormat(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	dir := t.TempDir()
	in, out := filepath.Join(dir, "event.bin"), filepath.Join(dir, "audit.bin")
	const task = "t-java-1"
	javaCheck(t, "encode", "../avro", in, task, "java-e-1")
	value, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := avro.Current(avro.TaskEvent)
	if len(value) < 10 || bin.LittleEndian.Uint64(value[2:10]) != cur.Fingerprint {
		t.Fatalf("Java's header % x is not c3 01 + TaskEvent's fingerprint %016x", value[:min(len(value), 10)], cur.Fingerprint)
	}

	cl := kafkaClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.prefix + "ai.tasks.ingress", Key: []byte(task), Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	audit := byTask(e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, task)) > 0 }), task)
	if len(audit) != 1 {
		t.Fatalf("audit for %s: %v, want one record", task, audit)
	}
	if got := str(audit[0], "decision.class") + "/" + str(audit[0], "decision.route"); got != "NETWORK_TIMEOUT/RETRY" {
		t.Fatalf("Java's event was routed %s, want NETWORK_TIMEOUT/RETRY: %v", got, audit[0])
	}

	var raw []byte
	for _, r := range readTopic(ctx, t, e.prefix+"ai.tasks.audit", true) {
		if string(r.Key) == task {
			raw = r.Value
		}
	}
	if raw == nil {
		t.Fatal("no audit record keyed by the task")
	}
	if err := os.WriteFile(out, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Event struct {
			TaskID     string            `json:"task_id"`
			Attributes map[string]string `json:"attributes"`
		} `json:"event"`
		Decision struct {
			Class, Route string
			Retry        struct {
				N int `json:"n"`
			} `json:"retry"`
		} `json:"decision"`
	}
	text := javaCheck(t, "decode", "../avro", out)
	if err := json.Unmarshal([]byte(text), &decoded); err != nil {
		t.Fatalf("Java's decoded RoutedRecord is not JSON: %v\n%s", err, text)
	}
	if decoded.Event.TaskID != task || decoded.Event.Attributes["client"] != "java-avro" ||
		decoded.Decision.Class != "NETWORK_TIMEOUT" || decoded.Decision.Route != "RETRY" || decoded.Decision.Retry.N != 1 {
		t.Fatalf("Java's BinaryMessageDecoder read %+v from the audit record", decoded)
	}
}

// Guards the Python package (clients/python) against the real router: its
// router suite (tests/test_router.py) has the pinned openai and anthropic
// SDKs, instrumented, report 429s, 500s, timeouts, auth and input errors,
// refusals and answers with fastavro's encoding and the murmur2
// partitioner, and asserts the router's decisions (retry when due, review,
// dead letter), a retry taken back and completed, and a reviewer's decision
// read back; here, from the router's side, nothing it sent was invalid.
func TestPythonWorker(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	pythonWorkerSuite(t, e, r)
}

// pythonWorkerSuite runs the Python package's router suite against router r
// of env e and checks, from the router's side, that nothing it sent was
// audited as invalid input (its only dead letter is the exhausted timeouts
// it asks for). The suite runs unbuffered, and a test stuck for 50 s prints
// where it is.
func pythonWorkerSuite(t *testing.T, e *env, r *router) {
	t.Helper()
	python := interop(t, "FAULTROUTER_PYTHON", "python")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-u", "-m", "pytest", "-q", "-o", "faulthandler_timeout=50", "-p", "no:cacheprovider", "tests/test_router.py")
	cmd.Dir = pythonClient
	cmd.Env = e.cmdEnv()
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("pytest: %v; router logs:\n%s", err, r.logs.String())
	}
	pytestPassed(t, out)
	for _, rec := range e.tailNow("deadletter") {
		if !strings.HasPrefix(str(rec, "task_id"), "py-timeouts-") {
			t.Errorf("dead-lettered: %v", rec)
		}
	}
	for _, rec := range e.tailNow("audit") {
		if str(rec, "decision.class") == "INVALID_INPUT" {
			t.Errorf("invalid input from Python: %v", rec)
		}
	}
}
