package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Guards the refusals of the schema registry flags: each is one clear
// message naming the flag, before anything is sent.
func TestRegistryFlagRefusals(t *testing.T) {
	t.Setenv("FAULTROUTER_REGISTRY_URL", "")
	t.Setenv("FAULTROUTER_WIRE_FORMAT", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"produce", "--wire-format", "avro"}, "--wire-format"},
		{[]string{"produce", "--wire-format", "confluent"}, "needs --registry-url"},
		{[]string{"run", "--state-dir", t.TempDir(), "--wire-format", "confluent"}, "needs --registry-url"},
		{[]string{"tail", "--topic", "audit", "--registry-url", "ftp://x"}, "--registry-url"},
		{[]string{"review", "decide", "--task", "t", "--approve", "--reason", "r", "--wire-format", "confluent"}, "needs --registry-url"},
		{[]string{"schemas", "check"}, "--registry is required"},
		{[]string{"schemas", "check", "--registry", "http://127.0.0.1:1", "--topic", "ingress"}, "--topic and --file go together"},
		{[]string{"schemas", "frobnicate"}, "register and check"},
		{[]string{"schemas", "register", "--registry", "http://127.0.0.1:1", "--registry-password", "p"}, "Username"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := dispatch(context.Background(), c.args, strings.NewReader(""), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// Guards `schemas register` and `schemas check` on a fake registry (srfake
// answers every compatibility check with yes: the refusals are tested
// against a real registry in integration/): register prints each subject
// with its ID; check prints each compatible subject with its level; a
// registry that cannot be reached is exit status 2 (errUnreachable); a file
// that is not an Avro schema is refused naming it.
func TestSchemasCommand(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"schemas", "register", "--registry", fake.URL(), "--compatibility", "BACKWARD"},
		strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "registered ai.tasks.ingress-value: schema ID") || strings.Count(out.String(), "registered ") != 7 {
		t.Fatalf("register printed:\n%s", out.String())
	}
	out.Reset()
	if err := dispatch(context.Background(), []string{"schemas", "check", "--registry", fake.URL()}, strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "compatible   ai.tasks.alerts-value (level BACKWARD)") {
		t.Fatalf("check printed:\n%s", out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.avsc")
	os.WriteFile(bad, []byte(`{"type": "nope"}`), 0o644)
	err := dispatch(context.Background(), []string{"schemas", "check", "--registry", fake.URL(), "--topic", "ingress", "--file", bad}, strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not an Avro schema") {
		t.Fatalf("a bad schema file: %v", err)
	}
	fake.Close()
	err = dispatch(context.Background(), []string{"schemas", "check", "--registry", fake.URL()}, strings.NewReader(""), io.Discard, io.Discard)
	var unreachable errUnreachable
	if !errors.As(err, &unreachable) {
		t.Fatalf("a registry that is down: %v, want errUnreachable (exit 2)", err)
	}
}
