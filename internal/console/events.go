package console

// events.go: live updates. The ingest loop and the handlers publish notes;
// every open page holds one server-sent-events stream (/events) and updates
// itself: a review row decided by someone else greys out at once, a new
// alert appears at the top of the feed, the rebuild's progress moves.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// note is one change the pages hear about.
type note struct {
	Kind  string      // review, alert, deadletter, progress, job
	Item  *reviewItem // review
	Alert *alert      // alert
	Job   *job        // job
}

// hub fans notes out to the open streams; a slow stream loses notes rather
// than holding up the ingest loop.
type hub struct {
	mu     sync.Mutex
	subs   map[chan note]bool
	closed bool
}

func newHub() *hub { return &hub{subs: map[chan note]bool{}} }

// maxStreams bounds the open live-update streams of one console.
const maxStreams = 500

// subscribe opens a stream; nil when maxStreams are open.
func (h *hub) subscribe() chan note {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= maxStreams {
		return nil
	}
	c := make(chan note, 64)
	if h.closed {
		close(c)
		return c
	}
	h.subs[c] = true
	return c
}

func (h *hub) unsubscribe(c chan note) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[c] {
		delete(h.subs, c)
		close(c)
	}
}

func (h *hub) publish(n note) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.subs {
		select {
		case c <- n:
		default:
		}
	}
}

func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for c := range h.subs {
		close(c)
	}
	h.subs = map[chan note]bool{}
}

// events streams the notes as server-sent events, shaped for the pages'
// script (static/console.js).
func (s *Server) events(w http.ResponseWriter, r *http.Request, p *person) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	c := s.hub.subscribe()
	if c == nil {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "too many live-update streams are open", http.StatusServiceUnavailable)
		return
	}
	defer s.hub.unsubscribe(c)
	// the stream outlives the server's WriteTimeout: each write extends it
	rc := http.NewResponseController(w)
	extend := func() { rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) }
	send := func(kind string, v any) {
		extend()
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", kind, b)
		fl.Flush()
	}
	send("hello", map[string]any{"name": p.Name})
	tick := time.NewTicker(min(20*time.Second, s.cfg.WriteTimeout/2))
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !p.Proxy && s.checkSession(nil, r, false) == nil {
				return // signed out, removed or expired: the stream ends with the session
			}
			extend()
			fmt.Fprint(w, ": keep-alive\n\n")
			fl.Flush()
		case n, ok := <-c:
			if !ok {
				return
			}
			switch n.Kind {
			case "review":
				send("review", s.itemState(n.Item))
			case "alert":
				send("alert", alertRow(n.Alert))
			case "progress":
				read, total, caughtUp, err := s.prog.snapshot()
				send("progress", map[string]any{"read": read, "total": total, "caught_up": caughtUp, "error": err})
			case "job":
				send("job", n.Job.row())
			case "deadletter":
				send("deadletter", map[string]any{})
			}
		}
	}
}

// itemState is what a review row shows about its item's state.
func (s *Server) itemState(it *reviewItem) map[string]any {
	m := map[string]any{"task_id": it.TaskID, "state": "open"}
	switch {
	case !it.open() && it.Closed != nil:
		m["state"], m["outcome"] = "closed", it.Closed.Rule
		if it.Decision != nil && !it.Decision.At.Before(it.OpenedAt) {
			m["by"] = it.Decision.Reviewer
		}
	case it.decided() != nil:
		d := it.decided()
		m["state"], m["by"], m["approve"] = "decided", d.Reviewer, d.Approve
	}
	if c, ok := s.sentOf(it); ok && it.open() {
		m["state"], m["by"], m["approve"] = "decided", c.By, c.Approve
	}
	if c, ok := s.claimOn(it, time.Now()); ok && m["state"] == "open" {
		claimNote(m, c)
	}
	return m
}
