package console

// jobs.go: a re-drive runs as a job. It sends its records in order, in
// chunks of at most one second's worth (its rate), each chunk one Kafka
// transaction, so records of one task keep their order; an operator pauses,
// resumes or stops it from the page. The job (who ran it, why, what it
// selected, how far it got) is kept in the view; a job that was running
// when the console stopped shows as interrupted.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/control"
)

// Job states.
const (
	jobRunning     = "running"
	jobPaused      = "paused"
	jobStopped     = "stopped"
	jobDone        = "done"
	jobFailed      = "failed"
	jobInterrupted = "interrupted"
)

// job is one re-drive.
type job struct {
	ID        string    `json:"id"`
	By        string    `json:"by"`
	Reason    string    `json:"reason"`
	Selection string    `json:"selection"`
	Rate      int       `json:"rate"`
	Total     int       `json:"total"`
	Sent      int       `json:"sent"`
	Refused   int       `json:"refused"` // by the loop guard, at the preview
	State     string    `json:"state"`
	Error     string    `json:"error,omitempty"`
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended"`
}

func (j *job) row() map[string]any {
	return map[string]any{"id": j.ID, "state": j.State, "sent": j.Sent, "total": j.Total}
}

// jobs are the re-drive jobs of this console.
type jobs struct {
	s  *Server
	mu sync.Mutex
	// all holds every job; ctl the running ones' controls.
	all map[string]*job
	ctl map[string]*jobCtl
	wg  sync.WaitGroup
}

type jobCtl struct {
	pause  bool
	stop   bool
	wake   chan struct{}
	cancel context.CancelFunc
	// sending is held while a chunk is sent: a pause waits for it, so that a
	// job the page shows paused sends nothing more
	sending sync.Mutex
}

func newJobs(s *Server) *jobs { return &jobs{s: s, all: map[string]*job{}, ctl: map[string]*jobCtl{}} }

// load reads the jobs of earlier runs; running ones were interrupted.
func (js *jobs) load() error {
	return js.s.view.each("job/", false, func(_ string, val []byte) bool {
		var j job
		if json.Unmarshal(val, &j) == nil {
			if j.State == jobRunning || j.State == jobPaused {
				j.State = jobInterrupted
			}
			js.all[j.ID] = &j
		}
		return true
	})
}

// save writes the job to the view; called with js.mu held.
func (js *jobs) save(j *job) {
	b := js.s.view.batch()
	if err := b.put("job/"+j.ID, j); err == nil {
		b.commit()
	}
	cp := *j
	js.s.hub.publish(note{Kind: "job", Job: &cp})
}

// list returns the jobs, newest first.
func (js *jobs) list() []job {
	js.mu.Lock()
	defer js.mu.Unlock()
	out := make([]job, 0, len(js.all))
	for _, j := range js.all {
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b job) int { return b.Started.Compare(a.Started) })
	return out
}

// start runs a job that sends recs at rate records per second.
func (js *jobs) start(by, reason, selection string, rate int, recs []*kgo.Record, refused int) *job {
	now := time.Now()
	j := &job{ID: fmt.Sprintf("r%d", now.UnixMilli()), By: by, Reason: reason, Selection: selection, Rate: rate,
		Total: len(recs), Refused: refused, State: jobRunning, Started: now}
	ctx, cancel := context.WithCancel(context.Background())
	c := &jobCtl{wake: make(chan struct{}, 1), cancel: cancel}
	js.mu.Lock()
	for js.all[j.ID] != nil {
		j.ID += "x"
	}
	js.all[j.ID], js.ctl[j.ID] = j, c
	js.save(j)
	js.mu.Unlock()
	js.s.log.Info("console: re-drive job started", "job", j.ID, "operator", by, "records", len(recs), "reason", reason)
	js.wg.Add(1)
	go func() {
		defer js.wg.Done()
		js.run(ctx, j, c, recs)
	}()
	return j
}

func (js *jobs) run(ctx context.Context, j *job, c *jobCtl, recs []*kgo.Record) {
	defer c.cancel()
	finish := func(state, errMsg string) {
		js.mu.Lock()
		j.State, j.Error, j.Ended = state, errMsg, time.Now()
		delete(js.ctl, j.ID)
		js.save(j)
		js.mu.Unlock()
		js.s.log.Info("console: re-drive job ended", "job", j.ID, "state", state, "sent", j.Sent, "err", errMsg)
	}
	for sent := 0; sent < len(recs); {
		c.sending.Lock()
		js.mu.Lock()
		paused, stopped := c.pause, c.stop
		js.mu.Unlock()
		if stopped || ctx.Err() != nil {
			c.sending.Unlock()
			finish(jobStopped, "")
			return
		}
		if paused {
			c.sending.Unlock()
			select {
			case <-c.wake:
			case <-ctx.Done():
			}
			continue
		}
		t0 := time.Now()
		chunk := recs[sent:min(sent+j.Rate, len(recs))]
		err := control.ProduceTx(ctx, js.s.cfg.Kafka, chunk)
		if err == nil {
			sent += len(chunk)
			js.mu.Lock()
			j.Sent = sent
			js.save(j)
			js.mu.Unlock()
		}
		c.sending.Unlock()
		if err != nil {
			finish(jobFailed, err.Error())
			return
		}
		if sent < len(recs) {
			select {
			case <-time.After(time.Second - time.Since(t0)):
			case <-c.wake:
			case <-ctx.Done():
			}
		}
	}
	finish(jobDone, "")
}

// control pauses, resumes or stops a running job. A pause returns, and the
// job shows paused, once the chunk being sent (if any) is committed: from
// then on the job sends nothing until it is resumed.
func (js *jobs) control(id, op string) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	j, c := js.all[id], js.ctl[id]
	switch {
	case j == nil:
		return notFound(fmt.Sprintf("No re-drive job %q.", id))
	case c == nil:
		return conflict(fmt.Sprintf("Job %s is %s already.", id, j.State))
	}
	switch op {
	case "pause":
		c.pause = true
		js.mu.Unlock()
		c.sending.Lock() // the chunk in flight, if any, is committed
		c.sending.Unlock()
		js.mu.Lock()
		if !c.pause || js.ctl[id] == nil { // resumed, or ended, meanwhile
			return nil
		}
		j.State = jobPaused
	case "resume":
		c.pause, j.State = false, jobRunning
	case "stop":
		c.stop = true
	default:
		return badRequest(fmt.Sprintf("Unknown job operation %q: pause, resume or stop.", op))
	}
	js.save(j)
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// stopAll stops every running job and waits for them.
func (js *jobs) stopAll() {
	js.mu.Lock()
	for _, c := range js.ctl {
		c.stop = true
		c.cancel()
	}
	js.mu.Unlock()
	js.wg.Wait()
}

func (s *Server) jobControl(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "controlling a re-drive"); err != nil {
		return err
	}
	id, op := r.PathValue("id"), r.PathValue("op")
	if op != "pause" && op != "resume" && op != "stop" {
		return badRequest(fmt.Sprintf("Unknown job operation %q: pause, resume or stop.", op))
	}
	s.jobs.mu.Lock()
	j, running, state := s.jobs.all[id], s.jobs.ctl[id] != nil, ""
	if j != nil {
		state = string(j.State)
	}
	s.jobs.mu.Unlock()
	switch {
	case j == nil:
		return notFound(fmt.Sprintf("No re-drive job %q.", id))
	case !running:
		return conflict(fmt.Sprintf("Job %s is %s already.", id, state))
	}
	// the operator log first: a control that cannot be logged is not applied
	if err := s.record(r.Context(), opAction{Action: "job_" + op, User: p.Name, What: "re-drive job " + id}); err != nil {
		return err
	}
	if err := s.jobs.control(r.PathValue("id"), r.PathValue("op")); err != nil {
		return err
	}
	http.Redirect(w, r, "/deadletter", http.StatusSeeOther)
	return nil
}
