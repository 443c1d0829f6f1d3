// Package logging builds faultrouter's slog loggers. In text form every line
// that carries a task_id starts with [TASK:<id>], so that one grep gives a
// task's whole story; the JSON form carries task_id as an ordinary field.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
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
type TaskHandler struct {
	mu    *sync.Mutex
	w     io.Writer
	opts  *slog.HandlerOptions
	task  string
	attrs []slog.Attr
	group string
}

// NewTaskHandler returns a TaskHandler writing to w.
func NewTaskHandler(w io.Writer, opts *slog.HandlerOptions) *TaskHandler {
	if opts == nil {
		opts = &slog.HandlerOptions{}
	}
	return &TaskHandler{mu: new(sync.Mutex), w: w, opts: opts}
}

// Enabled implements slog.Handler.
func (h *TaskHandler) Enabled(_ context.Context, l slog.Level) bool {
	min := slog.LevelInfo
	if h.opts.Level != nil {
		min = h.opts.Level.Level()
	}
	return l >= min
}

// Handle implements slog.Handler.
func (h *TaskHandler) Handle(ctx context.Context, r slog.Record) error {
	task := h.task
	if task == "" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == TaskKey {
				task = a.Value.String()
				return false
			}
			return true
		})
	}
	var b strings.Builder
	if task != "" {
		b.WriteString("[TASK:")
		b.WriteString(task)
		b.WriteString("] ")
	}
	var inner slog.Handler = slog.NewTextHandler(&b, h.opts)
	if len(h.attrs) > 0 {
		inner = inner.WithAttrs(h.attrs)
	}
	if h.group != "" {
		inner = inner.WithGroup(h.group)
	}
	if err := inner.Handle(ctx, r); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

// WithAttrs implements slog.Handler.
func (h *TaskHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	if h.group == "" {
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
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}
