package logging

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Guards the fast text path's contract: a line it formats is byte for byte
// the line slog's TextHandler writes (with the [TASK:<id>] prefix), for
// random messages, keys and values of every kind it takes, strings with
// whatever needs quoting, attributes given by With, and custom levels.
func TestFastTextMatchesTextHandler(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"", " ", "=", "\"", "\\", "a", "task-1", "é", "\u00a0", "\u2028", "\u200b", "\x7f", "\x01", "\n", "\t",
		"\xff", "日本", "😀", "[x]", "k=v", "x y", "a\\b", "{}", "%", "'", "\u0085", "\ufeff", "\U0001F600"}
	str := func() string {
		var b []byte
		for range rng.IntN(4) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		return string(b)
	}
	key := func() string {
		if k := str(); k != "" {
			return k
		}
		return "k"
	}
	floats := []float64{0, math.Copysign(0, -1), 1.5, -2.25e-7, 1e21, 123456789, math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat64}
	zones := []*time.Location{time.UTC, time.FixedZone("x", 5*3600+1800), time.FixedZone("y", -7*3600)}
	value := func() slog.Value {
		switch rng.IntN(7) {
		case 0:
			return slog.StringValue(str())
		case 1:
			return slog.Int64Value(rng.Int64() - math.MaxInt64/2)
		case 2:
			return slog.Uint64Value(rng.Uint64())
		case 3:
			return slog.Float64Value(floats[rng.IntN(len(floats))])
		case 4:
			return slog.BoolValue(rng.IntN(2) == 0)
		case 5:
			return slog.DurationValue(time.Duration(rng.Int64N(int64(100 * time.Hour))))
		default:
			return slog.TimeValue(time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))]))
		}
	}
	levels := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError, slog.LevelInfo + 2, slog.LevelError + 4, slog.LevelDebug - 3}
	for i := range 50000 {
		var fast, slow bytes.Buffer
		opts := &slog.HandlerOptions{Level: slog.LevelDebug - 10}
		fh, sh := slog.Handler(NewTaskHandler(&fast, opts)), slog.Handler(NewTaskHandler(&slow, opts))
		sh.(*TaskHandler).fast = false
		if rng.IntN(3) == 0 {
			var with []slog.Attr
			for range 1 + rng.IntN(3) {
				with = append(with, slog.Attr{Key: key(), Value: value()})
			}
			if rng.IntN(4) == 0 {
				with = append(with, slog.String(TaskKey, str()))
			}
			fh, sh = fh.WithAttrs(with), sh.WithAttrs(with)
		}
		tm := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
		if rng.IntN(10) == 0 {
			tm = time.Time{}
		} else if rng.IntN(4) == 0 {
			tm = time.Now() // with a monotonic reading
		}
		r := slog.NewRecord(tm, levels[rng.IntN(len(levels))], str(), 0)
		for range rng.IntN(10) {
			r.AddAttrs(slog.Attr{Key: key(), Value: value()})
		}
		if rng.IntN(2) == 0 {
			r.AddAttrs(slog.String(TaskKey, str()))
		}
		if !fh.(*TaskHandler).fast || !fastAttrs(&r) {
			t.Fatalf("case %d does not take the fast path", i)
		}
		if err := fh.Handle(context.Background(), r.Clone()); err != nil {
			t.Fatal(err)
		}
		if err := sh.Handle(context.Background(), r.Clone()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fast.Bytes(), slow.Bytes()) {
			t.Fatalf("case %d:\nfast %q\ntext %q", i, fast.String(), slow.String())
		}
	}
}

// Guards the fall-back: what the fast path does not take (a group, a value
// of another kind, a key-less attribute, ReplaceAttr) is still written, by
// the TextHandler.
func TestFastTextFallsBack(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewTaskHandler(&buf, nil))
	log.Info("a", "task_id", "t-1", "m", map[string]int{"x": 1})
	log.With("c", "r").WithGroup("g").Info("b", "task_id", "t-2", "n", 1)
	log.Info("c", slog.Group("h", "x", 1), "task_id", "t-3")
	rep := slog.New(NewTaskHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == "secret" {
			a.Value = slog.StringValue("***")
		}
		return a
	}}))
	rep.Info("d", "task_id", "t-4", "secret", "pw")
	out := buf.String()
	for _, want := range []string{"[TASK:t-1] ", "m=map[x:1]", "msg=b c=r g.task_id=t-2 g.n=1", "h.x=1", "[TASK:t-3] ", "[TASK:t-4] ", "secret=***"} {
		if !bytes.Contains([]byte(out), []byte(want)) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if bytes.Contains([]byte(out), []byte("pw")) {
		t.Errorf("ReplaceAttr was not applied:\n%s", out)
	}
}

// BenchmarkRoutedLine is the router's line per decision, formatted by the
// fast path and by slog's TextHandler (the same bytes), to io.Discard.
//
//	go test -run='^$' -bench=RoutedLine ./internal/logging
func BenchmarkRoutedLine(b *testing.B) {
	for _, fast := range []bool{true, false} {
		name := "fast"
		if !fast {
			name = "TextHandler"
		}
		b.Run(name, func(b *testing.B) {
			h := NewTaskHandler(io.Discard, nil)
			h.fast = fast
			log := slog.New(h).With("component", "router")
			b.ReportAllocs()
			for i := range b.N {
				log.Info("routed", "task_id", "s148969409-t33559", "topic", "ai.tasks.ingress", "partition", int32(i%6), "offset", int64(i),
					"class", "OUTCOME_UNKNOWN", "route", "REVIEW", "rule", "outcome_unknown.hold",
					"reason", `WRITE operation s148969409-t33559-op is SUBMITTED with no receipt: held for reconciliation, never retried automatically`)
			}
		})
	}
}
