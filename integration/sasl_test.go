package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// saslListener is the broker's SASL_SSL listener as kafka.sh describes it in
// $FAULTROUTER_KAFKA_DIR/sasl.env.
type saslListener struct {
	brokers, user, password, ca string
}

// saslOf reads sasl.env of the broker under test. It skips the test when the
// broker has no SASL_SSL listener (FAULTROUTER_KAFKA_SASL_SSL=0, or a broker
// not started by kafka.sh), and fails instead when integration/test.sh asked
// for it (FAULTROUTER_REQUIRE_SASL).
func saslOf(t *testing.T) saslListener {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("FAULTROUTER_REQUIRE_SASL") != "" {
		skip = t.Fatalf
	}
	dir := os.Getenv("FAULTROUTER_KAFKA_DIR")
	if dir == "" {
		dir = "/tmp/faultrouter-kafka"
	}
	b, err := os.ReadFile(filepath.Join(dir, "sasl.env"))
	if err != nil {
		skip("no SASL_SSL listener: %v (kafka.sh start writes it; set FAULTROUTER_KAFKA_DIR to the broker's directory; a broker started by an older kafka.sh needs kafka.sh stop and start)", err)
	}
	kv := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	l := saslListener{kv["FAULTROUTER_TEST_SASL_BROKERS"], kv["FAULTROUTER_TEST_SASL_USER"], kv["FAULTROUTER_TEST_SASL_PASSWORD"], kv["FAULTROUTER_TEST_TLS_CA"]}
	if l.brokers == "" || l.user == "" || l.password == "" || l.ca == "" {
		t.Fatalf("%s/sasl.env lacks a value: %q", dir, b)
	}
	// the SASL_SSL listener must belong to the broker under test: port+2
	host, port, _ := net.SplitHostPort(strings.Split(brokers, ",")[0])
	p, _ := strconv.Atoi(port)
	if want := net.JoinHostPort(host, strconv.Itoa(p+2)); l.brokers != want {
		skip("%s/sasl.env is for %s, not the SASL_SSL listener %s of the broker under test", dir, l.brokers, want)
	}
	return l
}

// saslEnv is a test world that reaches the cluster only through the SASL_SSL
// listener, with the password in the environment (as the Helm chart passes
// it) and the mechanism and CA as flags.
func saslEnv(t *testing.T, l saslListener) *env {
	e := newEnv(t)
	e.brokers = l.brokers
	e.vars = []string{"FAULTROUTER_SASL_USER=" + l.user, "FAULTROUTER_SASL_PASSWORD=" + l.password}
	e.flags = []string{"--sasl-mechanism", "SCRAM-SHA-512", "--tls-ca", l.ca}
	return e
}

// Guards security: everything works over SASL_SSL with SCRAM-SHA-512 and
// only over it (topics, produce, run, tail, review decide, replay and its
// transactional re-drive), the router's decisions included; a wrong
// password, a missing CA and an unknown CA are each refused with an error
// naming the cause, by the router and by the CLI, without hanging; and the
// password appears in no log or output, with the router logging at debug.
func TestSASLSSL(t *testing.T) {
	l := saslOf(t)
	e := saslEnv(t, l)
	var outputs []string // every CLI output, searched for the password at the end
	cli := func(stdin string, args ...string) string {
		t.Helper()
		out, errOut, err := e.tryCLI(stdin, args...)
		outputs = append(outputs, out, errOut)
		if err != nil {
			t.Fatalf("faultrouter %s over SASL_SSL: %v\n%s\n%s", strings.Join(args, " "), err, out, errOut)
		}
		return out
	}

	cli("", "topics", "apply", "--partitions", "3")
	rt := e.startRouter("a", t.TempDir(), "--log-level", "debug")
	cli(taskEvent("ok-1", "t-ok", 1, okFields)+taskEvent("net-1", "t-net", 1, timeoutFields)+
		taskEvent("ref-1", "t-refuse", 1, refusalFields), "produce", "--topic", "ingress")

	// the decisions, read back with tail --until-end over SASL_SSL
	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(r) >= 3 })
	for task, want := range map[string]string{
		"t-ok":     "SUCCEEDED/COMPLETE",
		"t-net":    "NETWORK_TIMEOUT/RETRY",
		"t-refuse": "MODEL_REFUSAL/REVIEW",
	} {
		recs := byTask(audit, task)
		if len(recs) != 1 || str(recs[0], "decision.class")+"/"+str(recs[0], "decision.route") != want {
			t.Errorf("%s: audit %v, want one %s", task, recs, want)
		}
	}
	retries := byTask(e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-net")) >= 1 }), "t-net")
	if len(retries) != 1 || str(retries[0], "event_id") != "net-1" || get(retries[0], "decision.retry.n") != 1.0 {
		t.Fatalf("retry topic: %v, want the first retry of net-1", retries)
	}

	// a reviewer's decision reaches the router over SASL_SSL
	cli("", "review", "decide", "--task", "t-refuse", "--approve", "--reason", "the answer is right", "--reviewer", "it")
	refused := stateAudit(e, "t-refuse", 2)
	if got := stateRoute(refused[1]); got != "MODEL_REFUSAL/RETRY (MANUAL_OVERRIDE_SUCCESS)" {
		t.Errorf("after approve: audit %s, want MODEL_REFUSAL/RETRY (MANUAL_OVERRIDE_SUCCESS)", got)
	}

	// replay reads over SASL_SSL, and re-drives in one transaction over it
	out := cli("", "replay", "--task", "t-net", "--timeline")
	if !strings.Contains(out, "NETWORK_TIMEOUT -> RETRY") {
		t.Errorf("timeline of t-net lacks its retry decision:\n%s", out)
	}
	out, errOut, err := e.tryCLI("", "replay", "--topic", "review", "--task", "t-refuse", "--redrive-to", "ingress", "--reason", "sasl test")
	outputs = append(outputs, out, errOut)
	if err != nil || !strings.Contains(errOut, "re-drove 1 record(s)") {
		t.Fatalf("re-drive over SASL_SSL: %v\n%s\n%s", err, out, errOut)
	}
	ingress := parseLines(t, cli("", "replay", "--topic", "ingress", "--task", "t-refuse", "--format", "json"))
	if len(ingress) != 2 || get(ingress[1], "record.redrive") == nil {
		t.Errorf("ingress of t-refuse after the re-drive: %v, want the original and the re-driven record", ingress)
	}

	// refused: each error names its cause, for the CLI and the router
	stateDir := t.TempDir()
	runArgs := []string{"run", "--state-dir", stateDir, "--instance-id", "refused", "--group", e.prefix + "refused", "--metrics-addr", "127.0.0.1:0"}
	wrongCA := writeUnknownCA(t)
	for _, c := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{"wrong password", []string{"--sasl-password", "not-" + l.password}, []string{"SASL_AUTHENTICATION_FAILED", "invalid credentials", "SCRAM-SHA-512"}},
		{"missing CA", []string{"--sasl-mechanism", "SCRAM-SHA-512", "--tls"}, []string{"x509: certificate signed by unknown authority"}},
		{"unknown CA", []string{"--sasl-mechanism", "SCRAM-SHA-512", "--tls-ca", wrongCA}, []string{"x509: certificate signed by unknown authority"}},
	} {
		bad := *e
		bad.flags = c.flags
		if c.name == "wrong password" {
			bad.flags = append(append([]string{}, e.flags...), c.flags...)
		}
		for _, args := range [][]string{
			runArgs,
			{"tail", "--topic", "audit", "--from-beginning", "--until-end"},
			{"review", "decide", "--task", "t-net", "--reject", "--reason", "refused", "--reviewer", "it"},
		} {
			out, errOut, err := bad.tryCLI("", args...)
			outputs = append(outputs, out, errOut)
			if err == nil {
				t.Errorf("%s: faultrouter %s succeeded, want it refused", c.name, args[0])
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("%s: faultrouter %s: error lacks %q:\n%s", c.name, args[0], w, errOut)
				}
			}
		}
	}
	// nothing the refused commands tried reached the router
	if got := byTask(e.tailNow("audit"), "t-net"); len(got) != 1 {
		t.Errorf("t-net has %d audit records after the refused commands, want 1", len(got))
	}

	rt.stop(t)
	logs := rt.logs.String()
	if !strings.Contains(logs, "beginning sasl authentication") || !strings.Contains(logs, "mechanism=SCRAM-SHA-512") {
		t.Fatalf("the router's debug log does not show the SCRAM authentication it is checked for:\n%.3000s", logs)
	}
	if strings.Contains(logs, l.password) {
		t.Errorf("the password appears in the router's log")
	}
	for _, o := range outputs {
		if strings.Contains(o, l.password) {
			t.Errorf("the password appears in a command's output:\n%s", o)
		}
	}
}

// writeUnknownCA writes the PEM certificate of a CA that signed nothing the
// broker has, and returns its path.
func writeUnknownCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not the broker's CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "unknown-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
