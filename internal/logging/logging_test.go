package logging

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
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

// lockedBuffer is what the test and the logging goroutine share: a
// lockedbuf.Buffer read as lines.
type lockedBuffer struct{ lockedbuf.Buffer }

func (b *lockedBuffer) lines() []string {
	return strings.Split(strings.TrimSpace(b.String()), "\n")
}

// Guards the async logger's contract: every line is written, in the order
// it was logged, with its own attributes (a record's attributes are copied
// before the call returns), in both formats; and close writes what is
// queued.
func TestAsyncKeepsEveryLineInOrder(t *testing.T) {
	for _, format := range []Format{FormatText, FormatJSON} {
		var w lockedBuffer
		log, closeLog, err := NewAsync(&w, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		const n = 3 * asyncQueue / 2 // more than the queue holds: some lines wait for room
		attrs := make([]any, 0, 16)
		for i := range n {
			attrs = append(attrs[:0], "task_id", fmt.Sprintf("t-%d", i), "topic", "in", "partition", i%6, "offset", i,
				"class", "NETWORK_TIMEOUT", "route", "RETRY", "rule", "r", "reason", fmt.Sprintf("line %d", i))
			if i%100 == 0 {
				log.Warn("routed", attrs...)
			} else {
				log.Info("routed", attrs...)
			}
		}
		closeLog()
		lines := w.lines()
		if len(lines) != n {
			t.Fatalf("%s: %d lines written, want %d", format, len(lines), n)
		}
		for i, l := range lines {
			if !strings.Contains(l, fmt.Sprintf("line %d", i)) || !strings.Contains(l, fmt.Sprintf("t-%d", i)) {
				t.Fatalf("%s: line %d is %q", format, i, l)
			}
			if format == FormatText && !strings.HasPrefix(l, fmt.Sprintf("[TASK:t-%d] ", i)) {
				t.Fatalf("line %d has no task prefix: %q", i, l)
			}
		}
		log.Info("after close", "task_id", "t-last")
		if l := w.lines(); len(l) != n+1 || !strings.Contains(l[n], "after close") {
			t.Fatalf("%s: a line logged after close was not written at once", format)
		}
	}
}

// gate is a writer that blocks every write until it is opened.
type gate struct {
	open chan struct{}
	lockedBuffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	return g.lockedBuffer.Write(p)
}

// Guards what the async logger is for: the goroutine that logs does not
// wait for a slow writer (a blocked stderr pipe, a slow disk) while the
// queue has room; an error line waits until it and everything before it
// are written.
func TestAsyncDoesNotWaitForTheWriter(t *testing.T) {
	w := &gate{open: make(chan struct{})}
	log, closeLog, err := NewAsync(w, FormatText, "info")
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for i := range 100 {
			log.Info("routed", "task_id", fmt.Sprintf("t-%d", i))
		}
	}()
	select {
	case <-logged:
	case <-time.After(time.Minute):
		t.Fatal("100 info lines waited for a writer that writes nothing")
	}
	if l := w.lines(); len(l) != 1 || l[0] != "" {
		t.Fatalf("lines written through a closed gate: %q", l)
	}
	errored := make(chan struct{})
	go func() {
		defer close(errored)
		log.Error("store write failed", "task_id", "t-err")
	}()
	close(w.open)
	<-errored
	lines := w.lines()
	if len(lines) != 101 || !strings.Contains(lines[100], "store write failed") {
		t.Fatalf("an error line returned before it and the lines before it were written: %d lines", len(lines))
	}
}

// Guards the async logger against the caller's later writes: a map, a
// slice or a pointer logged is shown as it was when logged, and formatting
// it later does not read what the caller goes on writing (under -race this
// test fails if it does; without -race a map written while it is formatted
// can crash the process). Values keep their form: a string type as a
// string, a map as a JSON object in JSON.
func TestAsyncFreezesWhatTheCallerMayChange(t *testing.T) {
	type route string
	for _, format := range []Format{FormatText, FormatJSON} {
		w := &gate{open: make(chan struct{})} // nothing is formatted and written until the writes below are done
		log, closeLog, err := NewAsync(w, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		parts := map[string][]int32{"ingress": {0, 1}}
		offsets := []int64{7, 8}
		type pos struct{ Offset int64 }
		at := &pos{Offset: 41}
		key := []byte("k-1")
		log.Info("assigned", "task_id", "t-1", "parts", parts, "offsets", offsets, "at", at, "route", route("RETRY"),
			slog.Group("g", "parts", parts), "key", key)
		for i := range 1000 {
			parts["ingress"] = append(parts["ingress"], int32(i))
			parts[fmt.Sprint("t", i)] = nil
			offsets[0]++
			at.Offset++
			key[2]++
		}
		close(w.open)
		closeLog()
		line := w.lines()[0]
		var want []string
		if format == FormatText {
			want = []string{`parts="map[ingress:[0 1]]"`, `offsets="[7 8]"`, "at=&{Offset:41}", "route=RETRY", `g.parts="map[ingress:[0 1]]"`, "key=k-1"}
		} else {
			want = []string{`"parts":{"ingress":[0,1]}`, `"offsets":[7,8]`, `"at":{"Offset":41}`, `"route":"RETRY"`, `"g":{"parts":{"ingress":[0,1]}}`, `"key":"ay0x"`}
		}
		for _, s := range want {
			if !strings.Contains(line, s) {
				t.Errorf("%s: the line does not show %s as logged: %s", format, s, line)
			}
		}
	}
}

// level is a number that names itself (String), as breaker.State does;
// code one that marshals itself (MarshalJSON).
type level uint8

func (l level) String() string { return [...]string{"CLOSED", "OPEN"}[l] }

type code int

func (c code) MarshalJSON() ([]byte, error) { return []byte(fmt.Sprintf(`"C%d"`, int(c))), nil }

// Guards the async logger's lines against the synchronous handler's: the
// same call, with values that format or marshal themselves, a string type,
// a number type and a struct, writes the same line (time aside) in text and
// in JSON.
func TestAsyncWritesWhatTheHandlerWould(t *testing.T) {
	type route string
	type count int
	args := []any{"task_id", "t-1", "state", level(1), "code", code(7), "route", route("RETRY"), "n", count(3),
		"at", struct{ Offset int64 }{41}, "err", fmt.Errorf("wrapped: %w", errors.New("boom"))}
	stamp := regexp.MustCompile(`time=\S+ |"time":"[^"]+",`)
	for _, format := range []Format{FormatText, FormatJSON} {
		var sync bytes.Buffer
		slog1, err := New(&sync, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		slog1.Info("breaker", args...)
		var async lockedBuffer
		slog2, closeLog, err := NewAsync(&async, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		slog2.Info("breaker", args...)
		closeLog()
		want, got := stamp.ReplaceAllString(sync.String(), ""), stamp.ReplaceAllString(async.String(), "")
		if got != want {
			t.Errorf("%s:\nasync %s\n sync %s", format, got, want)
		}
	}
}
