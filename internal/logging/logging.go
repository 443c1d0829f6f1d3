// Package logging builds faultrouter's slog loggers. In text form every line
// that carries a task_id starts with [TASK:<id>], so that one grep gives a
// task's whole story; the JSON form carries task_id as an ordinary field.
package logging

import (
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"sync"
)

// TaskKey is the attribute that names the task of an event line.
const TaskKey = "task_id"

// Format is the output form of the logs.
type Format string

// Formats.
const (
	FormatText Format = "text"
	FormatJSON Format = "json"
)

// New returns a logger writing to w in the given format at the given level
// ("debug", "info", "warn" or "error").
func New(w io.Writer, format Format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("logging: --log-level %q: allowed debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case FormatText, "":
		return slog.New(NewTaskHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("logging: --log-format %q: allowed text, json", format)
	}
}

// TaskHandler is a text handler that prints [TASK:<id>] before every line
// that carries a task_id attribute.
//
// The router logs a line for every decision, so a line is on its hot path:
// the handler and its attributes are built once (WithAttrs, WithGroup), not
// for every line; a line of plain values (strings, numbers, bools, times,
// durations) is formatted by the fast path of fasttext.go, the same bytes
// as slog's TextHandler, which formats the others; and the prefix goes out
// in the line's single write.
type TaskHandler struct {
	out   *prefixWriter // shared by the handlers derived from one
	inner slog.Handler  // a TextHandler writing to out, with the attributes and groups so far
	opts  *slog.HandlerOptions
	task  string // the task_id given by WithAttrs outside any group
	group bool   // a group is open: attributes added now are not the task's
	// fast: lines whose attributes fastAttrs takes are formatted by
	// appendFastLine (fasttext.go), with pre, the attributes of WithAttrs
	fast bool
	pre  []byte
}

// prefixWriter writes each line it is given after the prefix of the line
// being handled, in one write. Its mutex is held from setting the prefix
// to the line's write (TaskHandler.Handle).
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(line []byte) (int, error) {
	if p.prefix == "" {
		return p.w.Write(line)
	}
	if err := p.write(append(appendTaskPrefix(p.buf[:0], p.prefix), line...)); err != nil {
		return 0, err
	}
	return len(line), nil
}

// writeRaw writes lines formatted already (Lines).
func (p *prefixWriter) writeRaw(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w.Write(b)
}

// writeLine writes r, formatted by appendFastLine after the prefix of task,
// in one write. The caller holds p.mu.
func (p *prefixWriter) writeLine(task string, r *slog.Record, pre []byte) error {
	return p.write(appendFastLine(appendTaskPrefix(p.buf[:0], task), r, pre))
}

// write writes line, built in p.buf, and keeps the buffer for the next
// line unless an outsized line grew it.
func (p *prefixWriter) write(line []byte) error {
	_, err := p.w.Write(line)
	p.buf = line
	if cap(p.buf) > 64<<10 {
		p.buf = nil
	}
	return err
}

// appendTaskPrefix appends "[TASK:<task>] ", or nothing for no task.
func appendTaskPrefix(b []byte, task string) []byte {
	if task == "" {
		return b
	}
	return append(append(append(b, "[TASK:"...), task...), "] "...)
}

// NewTaskHandler returns a TaskHandler writing to w.
func NewTaskHandler(w io.Writer, opts *slog.HandlerOptions) *TaskHandler {
	if opts == nil {
		opts = &slog.HandlerOptions{}
	}
	out := &prefixWriter{w: w}
	return &TaskHandler{out: out, inner: slog.NewTextHandler(out, opts), opts: opts,
		fast: opts.ReplaceAttr == nil && !opts.AddSource}
}

// Enabled implements slog.Handler.
func (h *TaskHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *TaskHandler) Handle(ctx context.Context, r slog.Record) error {
	task := h.task
	if task == "" && !h.group {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == TaskKey {
				task = a.Value.String()
				return false
			}
			return true
		})
	}
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	if h.fast && fastAttrs(&r) {
		return h.out.writeLine(task, &r, h.pre)
	}
	h.out.prefix = task
	return h.inner.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h *TaskHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.inner = h.inner.WithAttrs(attrs)
	if c.fast {
		c.pre, c.fast = appendFastAttrs(slices.Clip(h.pre), attrs)
	}
	if !h.group {
		for _, a := range attrs {
			if a.Key == TaskKey {
				c.task = a.Value.String()
			}
		}
	}
	return &c
}

// WithGroup implements slog.Handler.
func (h *TaskHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.inner = h.inner.WithGroup(name)
	c.group, c.fast = true, false
	return &c
}

// asyncQueue is the size of an async logger's queue of lines: a burst of
// this many lines does not wait for the writer.
const asyncQueue = 16384

// NewAsync is New for a process that logs a line per decision on its hot
// path (faultrouter run): a line is formatted and written by a goroutine of
// its own, in the order the lines were logged, so that the goroutine that
// logs it pays only for taking its attributes. A line at level Error waits
// until it and every line before it are written. When the queue is full a
// line waits for room: no line is dropped. close writes every line queued
// and stops the goroutine; lines logged after it are written at once. A
// process killed with lines queued loses them (at most the queue's length
// of lines, usually the last milliseconds of them); the audit topic holds
// every decision. A value that is not a string, a number, a bool, a time or
// a duration (a map, a slice, a pointer, an error) is formatted when it is
// logged, so that the line shows it as it was then.
//
// Lines that come faster than one write each are written several to a
// write: the goroutine writes what it has formatted whenever its queue is
// empty, before an error line returns, and every 64 KiB.
func NewAsync(w io.Writer, format Format, level string) (log *slog.Logger, close func(), err error) {
	out := &coalescer{w: w}
	l, err := New(out, format, level)
	if err != nil {
		return nil, nil, err
	}
	q := newLineQueue(out)
	go q.run()
	return slog.New(&asyncHandler{inner: l.Handler(), q: q, json: format == FormatJSON}), q.close, nil
}

// coalescer keeps the lines written to it until flush, up to 64 KiB; once
// direct, it writes each line at once.
type coalescer struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	direct bool
}

const coalesceBytes = 64 << 10

func (c *coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.direct {
		return c.w.Write(p)
	}
	if len(p) >= coalesceBytes { // a batch of lines (Lines): written as it is
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		return c.w.Write(p)
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= coalesceBytes {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *coalescer) flush(direct bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.flushLocked() // a line that cannot be written is lost, as with slog's own handlers
	c.direct = c.direct || direct
}

func (c *coalescer) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.w.Write(c.buf)
	if cap(c.buf) > 4*coalesceBytes {
		c.buf = nil
	} else {
		c.buf = c.buf[:0]
	}
	return err
}

// queued is a line waiting to be written by the handler it was logged with;
// written, if not nil, is closed once it is. raw, if not nil, is lines
// formatted already (Lines), written as they are.
type queued struct {
	h       slog.Handler
	r       slog.Record
	written chan struct{}
	raw     *[]byte
}

type lineQueue struct {
	mu      sync.Mutex
	room    *sync.Cond // signalled when the writer takes the lines queued
	pending []queued   // the lines queued, oldest first
	idle    bool       // the writer waits for wake
	closed  bool
	wake    chan struct{} // one token: lines were queued while the writer was idle, or close
	done    chan struct{}
	out     *coalescer // what the handlers write to
}

func newLineQueue(out *coalescer) *lineQueue {
	q := &lineQueue{wake: make(chan struct{}, 1), done: make(chan struct{}), out: out}
	q.room = sync.NewCond(&q.mu)
	return q
}

// put queues l, waiting for room when the queue is full. It reports false,
// queuing nothing, once the queue is closed and its lines written.
func (q *lineQueue) put(l queued) bool {
	q.mu.Lock()
	for len(q.pending) >= asyncQueue && !q.closed {
		q.room.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		<-q.done // the lines before this one are written
		return false
	}
	q.pending = append(q.pending, l)
	wake := q.idle
	q.idle = false
	q.mu.Unlock()
	if wake {
		q.signal()
	}
	return true
}

func (q *lineQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default: // a token is there already
	}
}

// run writes the queued lines, taking all there are at a time: a logging
// goroutine wakes the writer only when it was idle.
func (q *lineQueue) run() {
	defer close(q.done)
	var lines []queued
	for {
		q.mu.Lock()
		for len(q.pending) == 0 && !q.closed {
			q.idle = true
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if len(q.pending) == 0 { // closed, and everything written
			q.mu.Unlock()
			q.out.flush(true)
			return
		}
		lines, q.pending = q.pending, lines[:0]
		q.room.Broadcast()
		q.mu.Unlock()
		for _, l := range lines {
			if l.raw != nil {
				_, _ = q.out.Write(*l.raw) // a line that cannot be written is lost, as below
				putLinesBuf(l.raw)
				continue
			}
			_ = l.h.Handle(context.Background(), l.r) // slog.Logger drops a handler's error too
			if l.written != nil {
				q.out.flush(false)
				close(l.written)
			}
		}
		q.out.flush(false)
		clear(lines)
	}
}

func (q *lineQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.room.Broadcast()
	q.mu.Unlock()
	q.signal()
	<-q.done
}

// asyncHandler queues each line for the lineQueue's goroutine.
type asyncHandler struct {
	inner slog.Handler
	q     *lineQueue
	json  bool // the lines are JSON: a value is frozen as JSON, not as text
}

// frozen is r with every value the caller could still change (a map, a
// slice, a pointer: anything but a string, a number, a bool, a time or a
// duration) formatted now, as the handler would format it, so that the
// goroutine that writes the line later reads nothing the caller shares: a
// map the caller writes to while a line is formatted from it would crash
// the process.
func (h *asyncHandler) frozen(r slog.Record) slog.Record {
	fixed := true // every value is one the caller cannot change
	r.Attrs(func(a slog.Attr) bool {
		fixed = fastKind(a.Value.Kind()) // the kinds held by value
		return fixed
	})
	if fixed {
		return r.Clone() // the attributes past the first few are in a slice the caller may reuse
	}
	f := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		f.AddAttrs(h.freeze(a))
		return true
	})
	return f
}

func (h *asyncHandler) freeze(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	switch a.Value.Kind() {
	case slog.KindGroup:
		g := a.Value.Group()
		frozen := make([]slog.Attr, len(g))
		for i, ga := range g {
			frozen[i] = h.freeze(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(frozen...)}
	case slog.KindAny:
		return slog.Attr{Key: a.Key, Value: h.freezeAny(a.Value.Any())}
	}
	return a
}

func (h *asyncHandler) freezeAny(v any) slog.Value {
	switch x := v.(type) {
	case nil:
		return slog.AnyValue(nil)
	case error:
		return slog.StringValue(x.Error())
	case []byte: // as the text handler shows bytes: a string
		if !h.json {
			return slog.StringValue(string(x))
		}
	case encoding.TextMarshaler:
		if !h.json {
			if b, err := x.MarshalText(); err == nil {
				return slog.StringValue(string(b))
			}
		}
	}
	// a type that formats or marshals itself is shown as the handler would
	// show it: text by fmt's %+v (its String or Format method), JSON by
	// json.Marshal (its MarshalJSON or MarshalText method)
	switch v.(type) {
	case fmt.Stringer, fmt.Formatter:
		if !h.json {
			return slog.StringValue(fmt.Sprintf("%+v", v))
		}
	case json.Marshaler, encoding.TextMarshaler:
		if h.json {
			if b, err := json.Marshal(v); err == nil {
				return slog.AnyValue(json.RawMessage(b))
			}
		}
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String: // a string type of its own, e.g. a class or a route
		return slog.StringValue(rv.String())
	case reflect.Bool:
		return slog.BoolValue(rv.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return slog.Int64Value(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return slog.Uint64Value(rv.Uint())
	case reflect.Float32, reflect.Float64:
		return slog.Float64Value(rv.Float())
	}
	if h.json {
		if b, err := json.Marshal(v); err == nil {
			return slog.AnyValue(json.RawMessage(b))
		}
	}
	return slog.StringValue(fmt.Sprintf("%+v", v))
}

// Enabled implements slog.Handler.
func (h *asyncHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *asyncHandler) Handle(ctx context.Context, r slog.Record) error {
	l := queued{h: h.inner, r: h.frozen(r)}
	if r.Level >= slog.LevelError {
		l.written = make(chan struct{})
	}
	if !h.q.put(l) {
		return h.inner.Handle(ctx, r) // closed: written at once
	}
	if l.written != nil {
		<-l.written
	}
	return nil
}

// WithAttrs implements slog.Handler.
func (h *asyncHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &asyncHandler{inner: h.inner.WithAttrs(attrs), q: h.q, json: h.json}
}

// WithGroup implements slog.Handler.
func (h *asyncHandler) WithGroup(name string) slog.Handler {
	return &asyncHandler{inner: h.inner.WithGroup(name), q: h.q, json: h.json}
}
