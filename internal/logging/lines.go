package logging

// lines.go builds many lines of one logger at a time: the router's line per
// decision, a batch of thousands of them at once. Through slog each line is
// a Record, its attributes copied for the writer goroutine, queued, then
// formatted there; here the lines of a text logger made by NewAsync are
// formatted as they are added, by the fast path of fasttext.go (the same
// bytes the logger would write), into one buffer that the writer goroutine
// writes as it is (Flush). A line the fast path does not take (another
// logger, JSON, a group, a ReplaceAttr) goes through the logger's handler
// as a Record, as it would through Logger.Log.

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Lines builds lines of one logger (NewLines). Not safe for concurrent use.
type Lines struct {
	h    slog.Handler
	fast *TaskHandler // the text handler the lines are formatted for; nil: through h
	q    *lineQueue   // where Flush hands the buffer
	buf  *[]byte      // the lines so far (fast)

	// the line being built
	on  bool        // Start enabled it
	rec slog.Record // not fast

	// the lines' times, and the times of their attributes: a batch's
	// lines are logged within the same second, and its held retries come
	// due at a few times
	lineTime, attrTime secondFormat
}

// secondFormat appends times as appendRFC3339Millis does, formatting each
// second once: the time of the last second it formatted is kept, and only
// its milliseconds are written for another time within it.
type secondFormat struct {
	sec int64
	loc *time.Location
	b   []byte // the second's time with ".000" for milliseconds; nil: none yet
}

// millisAt is where the milliseconds begin in the format of a time of a
// four-digit year ("2006-01-02T15:04:05.").
const millisAt = len("2006-01-02T15:04:05.")

func (f *secondFormat) append(dst []byte, t time.Time) []byte {
	t = t.Truncate(time.Millisecond)
	sec, ms := t.Unix(), t.Nanosecond()/int(time.Millisecond)
	if f.b == nil || sec != f.sec || t.Location() != f.loc {
		f.b = appendRFC3339Millis(f.b[:0], t.Truncate(time.Second))
		f.sec, f.loc = sec, t.Location()
		if len(f.b) < millisAt+3 || f.b[millisAt-1] != '.' { // not a four-digit year
			f.b = nil
			return appendRFC3339Millis(dst, t)
		}
	}
	n := len(dst)
	dst = append(dst, f.b...)
	dst[n+millisAt] = byte('0' + ms/100)
	dst[n+millisAt+1] = byte('0' + ms/10%10)
	dst[n+millisAt+2] = byte('0' + ms%10)
	return dst
}

// NewLines returns the line builder of log.
func NewLines(log *slog.Logger) *Lines {
	l := &Lines{h: log.Handler()}
	if a, ok := l.h.(*asyncHandler); ok {
		if th, ok := a.inner.(*TaskHandler); ok && th.fast && !th.group && th.task == "" {
			l.fast, l.q = th, a.q
		}
	}
	return l
}

// linesBufs are the buffers of Lines, given back once written.
var linesBufs = sync.Pool{New: func() any { b := make([]byte, 0, linesFlush+8<<10); return &b }}

// linesFlush is how many bytes of lines End hands over at a time: a buffer
// stays about this size, and is reused, not grown line by line.
const linesFlush = 128 << 10

// Start begins a line at level lvl with message msg, logged at time t, of
// task task (its task_id attribute: the line's first). It reports false,
// and the line's attributes and End do nothing, if the logger does not log
// lvl.
func (l *Lines) Start(lvl slog.Level, msg string, t time.Time, task string) bool {
	l.on = l.h.Enabled(context.Background(), lvl)
	if !l.on {
		return false
	}
	if l.fast == nil {
		l.rec = slog.NewRecord(t, lvl, msg, 0)
		l.rec.AddAttrs(slog.String(TaskKey, task))
		return true
	}
	if l.buf == nil {
		l.buf = linesBufs.Get().(*[]byte)
	}
	b := appendTaskPrefix(*l.buf, task)
	if !t.IsZero() {
		b = append(b, "time="...)
		b = l.lineTime.append(b, t)
		b = append(b, ' ')
	}
	b = append(b, "level="...)
	b = appendTextString(b, lvl.String())
	b = append(b, " msg="...)
	b = appendTextString(b, msg)
	b = append(b, l.fast.pre...)
	*l.buf = b
	l.Str(TaskKey, task)
	return true
}

// Str adds the attribute key=v to the line.
func (l *Lines) Str(key, v string) {
	switch {
	case !l.on:
	case l.fast == nil:
		l.rec.AddAttrs(slog.String(key, v))
	default:
		*l.buf = appendTextString(l.key(key), v)
	}
}

// Int adds the attribute key=v to the line.
func (l *Lines) Int(key string, v int64) {
	switch {
	case !l.on:
	case l.fast == nil:
		l.rec.AddAttrs(slog.Int64(key, v))
	default:
		*l.buf = strconv.AppendInt(l.key(key), v, 10)
	}
}

// Time adds the attribute key=v to the line.
func (l *Lines) Time(key string, v time.Time) {
	switch {
	case !l.on:
	case l.fast == nil:
		l.rec.AddAttrs(slog.Time(key, v))
	default:
		*l.buf = l.attrTime.append(l.key(key), v)
	}
}

// key appends " key=" to the buffer.
func (l *Lines) key(key string) []byte {
	return append(appendTextString(append(*l.buf, ' '), key), '=')
}

// End ends the line. Built by the fast path, it waits for Flush; else it
// goes to the logger's handler now.
func (l *Lines) End() {
	switch {
	case !l.on:
	case l.fast == nil:
		_ = l.h.Handle(context.Background(), l.rec) // as Logger.Log, which drops a handler's error
		l.rec = slog.Record{}
	default:
		*l.buf = append(*l.buf, '\n')
		if len(*l.buf) >= linesFlush {
			l.Flush()
		}
	}
	l.on = false
}

// Flush hands the lines ended so far to the logger's writer goroutine, to
// be written after the lines logged before them, in one go.
func (l *Lines) Flush() {
	if l.buf == nil {
		return
	}
	if len(*l.buf) == 0 || !l.q.put(queued{raw: l.buf}) {
		if len(*l.buf) > 0 { // the logger is closed: written at once
			_, _ = l.fast.out.writeRaw(*l.buf)
		}
		putLinesBuf(l.buf)
	}
	l.buf = nil
}

// putLinesBuf gives a buffer back once written, unless an outsized batch
// grew it.
func putLinesBuf(b *[]byte) {
	if cap(*b) > 4*linesFlush {
		return
	}
	*b = (*b)[:0]
	linesBufs.Put(b)
}
