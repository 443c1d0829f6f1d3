package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Guards the new user's first look: `demo` ends with the stream's cost table
// (spend, cost prevented, by class and by stop), and `demo --whatif FILE`
// replays the stream through the candidate, self-check first.
func TestDemoEndsWithCostTable(t *testing.T) {
	cand := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(cand, []byte("network_timeout:\n  max_retries: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"demo", "--whatif", cand}, strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	cost, whatif := strings.Index(s, "Cost of the stream"), strings.Index(s, "What-if")
	if cost < 0 || whatif < cost {
		t.Fatalf("the demo does not print the cost table, then the what-if:\n%s", s)
	}
	table := s[cost:whatif]
	for _, want := range []string{"spend $", "cost prevented $", "BUDGET_EXHAUSTED", "STOP", "budget"} {
		if !strings.Contains(table, want) {
			t.Errorf("the cost table lacks %q:\n%s", want, table)
		}
	}
	w := s[whatif:]
	// the third timeouts of t-timeout and of the advisor's 30 acme tasks
	for _, want := range []string{"disagreements: 0", "changed: 31 decisions of 31 tasks", "DEADLETTER  ->  RETRY", "limits of a what-if"} {
		if !strings.Contains(w, want) {
			t.Errorf("the what-if lacks %q:\n%s", want, w)
		}
	}
}

// Guards the CLI contract "a bad flag is one clear message naming the field
// and what is allowed" for cost and policy whatif, before touching Kafka.
func TestCostAndWhatifBadFlags(t *testing.T) {
	cand := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(cand, []byte("network_timeout:\n  max_retries: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cost"}, "--since is required"},
		{[]string{"cost", "--since", "-1h", "--format", "yaml"}, "allowed table, json"},
		{[]string{"cost", "--since", "yesterday"}, "--since"},
		{[]string{"cost", "--since", "-1h", "--until", "-2h"}, "is not before --until"},
		{[]string{"policy", "whatif", "--since", "-1h"}, "--policy CANDIDATE.yaml is required"},
		{[]string{"policy", "whatif", "--policy", cand}, "--since is required"},
		{[]string{"policy", "whatif", "--policy", cand, "--since", "-1h", "--format", "xml"}, "allowed table, json, csv"},
		{[]string{"policy", "whatif", "--policy", cand, "--since", "-1h"}, "network_timeout.max_retries"},
		{[]string{"policy", "whatif", "--policy", "/nonexistent.yaml", "--since", "-1h"}, "nonexistent.yaml"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := dispatch(context.Background(), c.args, strings.NewReader(""), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}
