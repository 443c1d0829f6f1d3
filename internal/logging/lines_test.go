package logging

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"syscall"
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

// BenchmarkLines is BenchmarkRoutedLine's line through an async logger,
// one record at a time through slog (Logger.Info) and built by Lines, a
// batch of 5000 at a time: the CPU of the whole process a line (the
// writer goroutine's included), written to /dev/null.
func BenchmarkLines(b *testing.B) {
	const reason = `WRITE operation s148969409-t33559-op is SUBMITTED with no receipt: held for reconciliation, never retried automatically`
	for _, lines := range []bool{false, true} {
		name := "slog"
		if lines {
			name = "Lines"
		}
		b.Run(name, func(b *testing.B) {
			devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer devNull.Close()
			log, closeLog, err := NewAsync(devNull, FormatText, "info")
			if err != nil {
				b.Fatal(err)
			}
			log = log.With("component", "router")
			lb := NewLines(log)
			b.ReportAllocs()
			c0 := processCPU()
			for i := range b.N {
				if !lines {
					log.Info("routed", "task_id", "s148969409-t33559", "topic", "ai.tasks.ingress", "partition", int32(i%6), "offset", int64(i),
						"class", "OUTCOME_UNKNOWN", "route", "REVIEW", "rule", "outcome_unknown.hold", "reason", reason)
					continue
				}
				lb.Start(slog.LevelInfo, "routed", time.Now(), "s148969409-t33559")
				lb.Str("topic", "ai.tasks.ingress")
				lb.Int("partition", int64(i%6))
				lb.Int("offset", int64(i))
				lb.Str("class", "OUTCOME_UNKNOWN")
				lb.Str("route", "REVIEW")
				lb.Str("rule", "outcome_unknown.hold")
				lb.Str("reason", reason)
				lb.End()
				if i%5000 == 4999 {
					lb.Flush()
				}
			}
			lb.Flush()
			closeLog()
			b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/line")
		})
	}
}

// processCPU is the process's CPU time so far (user and system, every
// thread).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// secondFormat writes what appendRFC3339Millis writes, for times within one
// second, across seconds, zones and a year of five digits, in any order.
func TestSecondFormatWritesTheLoggersTimes(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+1800)
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	times := []time.Time{
		base, base.Add(7 * time.Millisecond), base.Add(999_999_999), base.Add(123_456_789),
		base.Add(time.Second + 40*time.Millisecond), base.In(ist), base.Add(5 * time.Millisecond).In(ist),
		base.Add(5 * time.Millisecond), base.Add(-time.Millisecond), time.Date(12345, 6, 7, 8, 9, 10, 11_000_000, time.UTC),
		base.Add(2 * time.Millisecond), time.Now(), time.Now().Add(time.Hour),
	}
	var f secondFormat
	for _, at := range times {
		want := string(appendRFC3339Millis(nil, at))
		if got := string(f.append([]byte("x="), at)); got != "x="+want {
			t.Errorf("%v: wrote %q, want %q", at, got, "x="+want)
		}
	}
}
