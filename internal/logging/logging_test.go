package logging

import (
	"bytes"
	"strings"
	"testing"
)

// Guards the log contract: a line with a task_id starts with [TASK:<id>], so
// one grep gives a task's whole story; lines without one are plain.
func TestTaskPrefix(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, FormatText, "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("routed", "task_id", "t-1", "route", "RETRY")
	log.With("task_id", "t-2").Info("decided", "class", "SUCCEEDED")
	log.Info("started")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %q", buf.String())
	}
	for i, want := range []string{"[TASK:t-1] ", "[TASK:t-2] ", "time="} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[0], "task_id=t-1") || !strings.Contains(lines[0], "route=RETRY") {
		t.Errorf("line 0 lost its attributes: %q", lines[0])
	}
}

// Guards the flag contract: a bad format or level is one clear error.
func TestBadFlags(t *testing.T) {
	if _, err := New(nil, "yaml", "info"); err == nil || !strings.Contains(err.Error(), "allowed text, json") {
		t.Errorf("bad format: %v", err)
	}
	if _, err := New(nil, FormatText, "loud"); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Errorf("bad level: %v", err)
	}
}
