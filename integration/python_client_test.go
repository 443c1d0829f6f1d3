package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/taskid"
)

// The Python package (clients/python) against this build: its task IDs, and
// its pytest suite against a router on the real broker. interop.sh installs
// the package and its pinned test dependencies (openai, anthropic,
// langchain-core) into the cached virtual environment.

const pythonClient = "../clients/python"

// Guards "the same task IDs as the Go generator, byte for byte": faultrouter's
// task_id in Python and pkg/taskid agree on every row of a table that covers
// empty and binary content, non-ASCII and empty fields, an authorization,
// fields whose concatenations collide, and a large input.
func TestPythonTaskIDsMatchGo(t *testing.T) {
	type row struct {
		Content       []byte `json:"content"` // base64 in JSON, as encoding/json writes []byte
		User          string `json:"user"`
		Action        string `json:"action"`
		Authorization string `json:"authorization"`
	}
	rows := []row{
		{[]byte("contract v3, page 1-12"), "alice@example.com", "contract_review", ""},
		{[]byte("refund order 1042: 30.00 EUR"), "bob", "refund", "approval-7"},
		{[]byte{}, "u", "a", ""},
		{[]byte{0, 0xff, 0xc3, 0x01, '\n'}, "u", "a", "auth"},
		{[]byte("合同第三版"), "张伟", "合同审核", "批准-1"},
		{[]byte("x"), "ab", "c", ""},
		{[]byte("x"), "a", "bc", ""},
		{[]byte("Cafe\u0301"), "Café", "REFUND", " "},
		{bytes.Repeat([]byte("invoice line\n"), 200_000), "u-17", "refund", ""},
	}
	in, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	python := interop(t, "FAULTROUTER_PYTHON", "python")
	const script = `
import base64, json, sys
from faultrouter import task_id
for r in json.load(sys.stdin):
    print(task_id(base64.b64decode(r["content"]), user=r["user"], action=r["action"], authorization=r["authorization"]))
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, errOut.String())
	}
	got := strings.Fields(string(out))
	if len(got) != len(rows) {
		t.Fatalf("python printed %d IDs for %d rows:\n%s", len(got), len(rows), out)
	}
	for i, r := range rows {
		want := taskid.FromContent(r.Content, r.User, r.Action, r.Authorization)
		if got[i] != want {
			t.Errorf("row %d (user %q, action %q, authorization %q, %d bytes): Python %s, Go %s",
				i, r.User, r.Action, r.Authorization, len(r.Content), got[i], want)
		}
	}
}

// pytestPassed fails the test unless pytest's summary says every test passed.
func pytestPassed(t *testing.T, out []byte) {
	t.Helper()
	if !regexp.MustCompile(`(?m)^\d+ passed(, \d+ deselected)? in `).Match(out) {
		t.Fatalf("pytest did not report every test passed:\n%s", out)
	}
}
