//go:build nextstate

package codec

import (
	"errors"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/task"
)

// Guards the nextstate build itself (go test -tags nextstate ./pkg/codec):
// it writes task states with a schema that is not the current one, and
// reads them back whole.
func TestNextStateBuild(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	st := &task.State{TaskID: "t-1", Attempts: 2, SeenEvents: []string{"e-1", "e-2"}, Review: task.ReviewOpen, SLAMs: 1000}
	b, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if fp, _ := SingleObjectFingerprint(b); fp == c.state.fp || fp != nextStateFP {
		t.Fatalf("fingerprint %016x: want the next schema's %016x", fp, nextStateFP)
	}
	got, err := c.DecodeState(b)
	if err != nil || got.TaskID != "t-1" || got.Attempts != 2 || len(got.SeenEvents) != 2 || got.Review != task.ReviewOpen {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	delete(c.writers, nextStateFP) // a release build
	if _, err := c.DecodeState(b); !errors.Is(err, ErrUnknownSchema) {
		t.Fatalf("a build without the next schema: %v, want ErrUnknownSchema", err)
	}
}
