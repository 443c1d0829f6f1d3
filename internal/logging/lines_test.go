package logging

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Guards Lines: the lines it builds are the bytes the logger itself writes
// for the same record, in both formats, with the logger's attributes, for
// any string; a level the logger does not log writes nothing; and the
// lines go out in order with the lines logged through the logger.
func TestLinesWriteWhatTheLoggerWrites(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 678_900_000, time.UTC)
	type line struct {
		lvl            slog.Level
		task, topic    string
		part           int64
		reason, holdBy string
	}
	lines := []line{
		{slog.LevelInfo, "t-1", "ai.tasks.ingress", 3, "plain", ""},
		{slog.LevelWarn, "t 2", "in", 0, `a "quoted" reason = with spaces`, ""},
		{slog.LevelInfo, "任务-3", "in", -1, "ünïcode\ttab\nnewline", "breaker open"},
		{slog.LevelInfo, "", "", 1 << 40, "", ""},
		{slog.LevelDebug, "t-5", "in", 5, "not logged at info", ""},
		{slog.LevelInfo, `back\slash`, "in", 6, `c:\path`, ""},
	}
	write := func(format Format, useLines bool, with []any) string {
		var w lockedBuffer
		log, closeLog, err := NewAsync(&w, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log = log.With(with...)
		plain := func(msg, task string) { // a line through the logger, at the fixed time
			r := slog.NewRecord(at, slog.LevelInfo, msg, 0)
			r.AddAttrs(slog.String("task_id", task))
			_ = log.Handler().Handle(context.Background(), r)
		}
		plain("before", "t-0")
		lb := NewLines(log)
		for _, l := range lines {
			if useLines {
				if lb.Start(l.lvl, "routed", at, l.task) {
					lb.Str("topic", l.topic)
					lb.Int("partition", l.part)
					lb.Str("reason", l.reason)
					if l.holdBy != "" {
						lb.Str("held", l.holdBy)
						lb.Time("due", at.Add(time.Second))
					}
					lb.End()
				}
				continue
			}
			r := slog.NewRecord(at, l.lvl, "routed", 0)
			r.AddAttrs(slog.String("task_id", l.task), slog.String("topic", l.topic), slog.Int64("partition", l.part), slog.String("reason", l.reason))
			if l.holdBy != "" {
				r.AddAttrs(slog.String("held", l.holdBy), slog.Time("due", at.Add(time.Second)))
			}
			if log.Handler().Enabled(context.Background(), l.lvl) {
				_ = log.Handler().Handle(context.Background(), r)
			}
		}
		if useLines {
			lb.Flush()
		}
		plain("after", "t-9")
		closeLog()
		return w.String()
	}
	for _, format := range []Format{FormatText, FormatJSON} {
		for _, with := range [][]any{{"component", "router", "instance", "a b"}, {"task_id", "fixed"}, nil} {
			want, got := write(format, false, with), write(format, true, with)
			if got != want {
				t.Errorf("%s, logger with %v: Lines wrote\n%s\nthe logger writes\n%s", format, with, got, want)
			}
			if n := strings.Count(want, "\n"); n != 2+len(lines)-1 {
				t.Errorf("%s, logger with %v: %d lines, want %d", format, with, n, 2+len(lines)-1)
			}
		}
	}
	// the fast path is the one taken for faultrouter run's logger
	log, closeLog, err := NewAsync(&lockedBuffer{}, FormatText, "info")
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	if NewLines(log.With("component", "router")).fast == nil {
		t.Fatal("Lines does not format the lines of the text logger itself")
	}
}
