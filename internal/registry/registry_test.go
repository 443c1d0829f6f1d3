package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

func newClient(t *testing.T, cfg Config) (*Client, *codec.Codec) {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	return r, c
}

func sampleEvent() event.TaskEvent {
	return event.TaskEvent{EventID: "e1", TaskID: "t1", Attempt: 1, OccurredAt: event.FromMillis(1_700_000_000_000),
		Source: "worker", Action: "refund", Status: event.StatusOK}
}

// TestFramerRoundTrip guards the wire format a registry user gets: a record
// framed for a topic carries the ID its schema has under <topic>-value, and
// reads back as the same event. (srfake, unit level only.)
func TestFramerRoundTrip(t *testing.T) {
	fake := srfake.New(srfake.WithAuth("Basic " + base64.StdEncoding.EncodeToString([]byte("u:p"))))
	defer fake.Close()
	r, c := newClient(t, Config{URL: fake.URL(), Username: "u", Password: "p"})
	cur, _ := avro.Current(avro.TaskEvent)
	f, err := r.Framer(context.Background(), []TopicSchema{{Topic: "ai.tasks.ingress", Schema: cur.JSON}}, true)
	if err != nil {
		t.Fatal(err)
	}
	e := sampleEvent()
	so, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	v := f.Frame("ai.tasks.ingress", append([]byte(nil), so...))
	id, ok := codec.ConfluentID(v)
	ss, found := fake.GetSchema("ai.tasks.ingress-value", 1)
	if !ok || !found || int(id) != ss.ID {
		t.Fatalf("framed with ID %d (ok %v), subject has %+v (found %v)", id, ok, ss, found)
	}
	back, err := r.Normalize(context.Background(), nil, v)
	if err != nil {
		t.Fatal(err)
	}
	if string(back) != string(so) {
		t.Fatal("normalized record differs from the single-object original")
	}
	if got := f.Frame("ai.tasks.other", append([]byte(nil), so...)); string(got) != string(so) {
		t.Fatal("a topic the framer was not built for was framed")
	}
}

// TestNormalizeFaults guards who is at fault: an ID the registry does not
// know is the record's (unknown_schema), a refused credential or a registry
// that does not answer is not (ErrUnavailable).
func TestNormalizeFaults(t *testing.T) {
	fake := srfake.New(srfake.WithAuth("Basic " + base64.StdEncoding.EncodeToString([]byte("u:p"))))
	defer fake.Close()
	rec := []byte{0, 0, 0, 0, 99, 1, 2, 3}

	r, _ := newClient(t, Config{URL: fake.URL(), Username: "u", Password: "p"})
	if _, err := r.Normalize(context.Background(), nil, rec); !errors.Is(err, codec.ErrUnknownSchema) {
		t.Fatalf("unknown ID: got %v", err)
	}
	bad, _ := newClient(t, Config{URL: fake.URL(), Username: "u", Password: "wrong"})
	if _, err := bad.Normalize(context.Background(), nil, rec); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("refused credentials: got %v", err)
	}
	fake.Close()
	if _, err := r.Normalize(context.Background(), nil, []byte{0, 0, 0, 0, 98, 1}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("registry down: got %v", err)
	}
	so := []byte{0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}
	if v, err := r.Normalize(context.Background(), nil, so); err != nil || string(v) != string(so) {
		t.Fatal("a single-object record needs no registry")
	}
}

// TestNotFoundAfterAnOutageIsAskedAgain guards a registry that restarts:
// it answers before it has reloaded its schemas, and says "not found" for
// an ID a producer got from it moments before. Within ReloadGrace of its
// last failure to answer that is not the record's fault (ErrUnavailable:
// routing waits and asks again); the ID is read once the registry has it.
// Without an outage, or with the grace turned off, an unknown ID is the
// record's (unknown_schema). (srfake, unit level only.)
func TestNotFoundAfterAnOutageIsAskedAgain(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	down := true
	fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		if down {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
		return down
	})
	cur, _ := avro.Current(avro.TaskEvent)
	_, c := newClient(t, Config{URL: fake.URL()})
	e := sampleEvent()
	so, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	rec := codec.ToConfluent(append([]byte(nil), so...), 700)

	r, _ := newClient(t, Config{URL: fake.URL()})
	if _, err := r.Normalize(context.Background(), nil, rec); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("registry down: got %v", err)
	}
	down = false // up, its schemas not loaded yet
	_, err = r.Normalize(context.Background(), nil, rec)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, codec.ErrUnknownSchema) {
		t.Fatalf("not found just after an outage: got %v, want ErrUnavailable", err)
	}
	fake.SeedSchema("ingress-value", 1, 700, sr.Schema{Schema: cur.JSON}) // reloaded
	v, err := r.Normalize(context.Background(), nil, rec)
	if err != nil || string(v) != string(so) {
		t.Fatalf("after the reload: %v", err)
	}

	unknown := codec.ToConfluent(append([]byte(nil), so...), 701)
	for name, cfg := range map[string]Config{"no outage": {URL: fake.URL()}, "grace off": {URL: fake.URL(), ReloadGrace: -1}} {
		r, _ := newClient(t, cfg)
		if name == "grace off" {
			down = true
			r.Normalize(context.Background(), nil, unknown)
			down = false
		}
		if _, err := r.Normalize(context.Background(), nil, unknown); !errors.Is(err, codec.ErrUnknownSchema) {
			t.Fatalf("%s: unknown ID: got %v, want unknown_schema", name, err)
		}
	}
}

// TestConfigRefusals guards the flag errors: each names the field.
func TestConfigRefusals(t *testing.T) {
	for _, cfg := range []Config{{}, {URL: "ftp://x"}, {URL: "http://x", Password: "p"}} {
		if err := cfg.Validate(); err == nil {
			t.Fatalf("%+v accepted", cfg)
		}
	}
	if _, err := ParseWireFormat("avro"); err == nil {
		t.Fatal("--wire-format avro accepted")
	}
}

// TestNormalizeInlinesReferences guards schemas registered with
// references, as Apicurio's serde registers a record's nested types: the
// referenced definitions are inlined and the record reads as the event it
// carries. (srfake, unit level only.)
func TestNormalizeInlinesReferences(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	r, c := newClient(t, Config{URL: fake.URL()})
	cur, _ := avro.Current(avro.TaskEvent)
	var m map[string]any
	if err := json.Unmarshal([]byte(cur.JSON), &m); err != nil {
		t.Fatal(err)
	}
	var errDef any
	for _, f := range m["fields"].([]any) {
		if fm := f.(map[string]any); fm["name"] == "error" {
			u := fm["type"].([]any)
			errDef, u[1] = u[1], "faultrouter.Error"
		}
	}
	errText, _ := json.Marshal(errDef)
	mainText, _ := json.Marshal(m)
	fake.SeedSchema("faultrouter.Error", 1, 500, sr.Schema{Schema: string(errText)})
	fake.SeedSchema("ingress-value", 1, 501, sr.Schema{Schema: string(mainText),
		References: []sr.SchemaReference{{Name: "faultrouter.Error", Subject: "faultrouter.Error", Version: 1}}})

	e := sampleEvent()
	e.Status, e.Error = event.StatusError, &event.Error{Type: "TimeoutError"}
	so, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	v, err := r.Normalize(context.Background(), nil, codec.ToConfluent(so, 501))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.DecodeTaskEvent(v)
	if err != nil {
		t.Fatal(err)
	}
	if got.Error == nil || got.Error.Type != "TimeoutError" || got.TaskID != e.TaskID {
		t.Fatalf("read %+v", got)
	}
}

// TestTLS guards --registry-tls-ca: a registry on https whose certificate
// the client's CA pool does not hold is refused (as unavailable: nothing
// about the record), and trusted with the CA given.
func TestTLS(t *testing.T) {
	fake := srfake.NewRegistry()
	srv := httptest.NewTLSServer(fake.Handler())
	defer srv.Close()
	cur, _ := avro.Current(avro.TaskEvent)
	untrusted, _ := newClient(t, Config{URL: srv.URL})
	if _, err := untrusted.Register(context.Background(), "t", cur.JSON); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("an untrusted certificate: got %v, want ErrUnavailable", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	trusted, _ := newClient(t, Config{URL: srv.URL, TLS: &tls.Config{RootCAs: pool}})
	if _, err := trusted.Register(context.Background(), "t", cur.JSON); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
}
