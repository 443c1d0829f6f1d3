package console

// deadletter.go: the dead letters, by time range, class, error kind, model
// and task, with their original bytes and error headers; a re-drive of the
// records picked by hand or of everything a filter matches ("all
// NETWORK_TIMEOUT for model m since 02:00"), always through a dry-run
// preview that gives the count and what the loop guard refuses, then run as
// a job (jobs.go).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// dlFilter selects dead letters.
type dlFilter struct {
	Since, Until       string // RFC 3339 or relative (-2h), as replay takes them
	Class, Kind, Model string
	Task               string
	since, until       time.Time
}

func dlFilterOf(get func(string) string) (dlFilter, error) {
	f := dlFilter{Since: get("since"), Until: get("until"), Class: strings.ToUpper(strings.TrimSpace(get("class"))),
		Kind: strings.TrimSpace(get("kind")), Model: strings.TrimSpace(get("model")), Task: strings.TrimSpace(get("task"))}
	now := time.Now()
	var err error
	if strings.TrimSpace(f.Since) != "" {
		if f.since, err = replay.ParseTime(f.Since, now); err != nil {
			return f, badRequest(fmt.Sprintf("Since %q: give an RFC 3339 time (2026-11-29T02:00:00Z) or a relative one (-2h).", f.Since))
		}
	}
	if strings.TrimSpace(f.Until) != "" {
		if f.until, err = replay.ParseTime(f.Until, now); err != nil {
			return f, badRequest(fmt.Sprintf("Until %q: give an RFC 3339 time or a relative one (-1h).", f.Until))
		}
	}
	return f, nil
}

func (f *dlFilter) match(d *deadLetter) bool {
	return (f.Class == "" || d.Class == f.Class) && (f.Kind == "" || d.ErrorKind == f.Kind) &&
		(f.Model == "" || d.Model == f.Model) && (f.Task == "" || d.TaskID == f.Task)
}

// dlScanMax bounds the dead letters one page or one re-drive selection
// looks through.
const dlScanMax = 50_000

// deadLetters returns the matching records in time order after the key
// after (exclusive; "" from the filter's start), at most limit; next is
// the key to go on from when it stopped before the end of the range (at
// limit, or after looking through dlScanMax records).
func (s *Server) deadLetters(f *dlFilter, limit int, after string) (out []deadLetter, next string, err error) {
	lo := "dl/"
	if !f.since.IsZero() {
		lo = "dl/" + timeKey(f.since.UnixMilli())
	}
	if strings.HasPrefix(after, "dl/") && after >= lo {
		lo = after + "\x00"
	}
	hi := "dl0"
	if !f.until.IsZero() {
		hi = "dl/" + timeKey(f.until.UnixMilli())
	}
	scanned, early := 0, false
	err = s.view.eachRange(lo, hi, false, func(k string, val []byte) bool {
		var d deadLetter
		if json.Unmarshal(val, &d) == nil && f.match(&d) {
			if len(out) == limit {
				early = true // one more than the page: there is a next
				return false
			}
			out = append(out, d)
		}
		next = k
		if scanned++; scanned >= dlScanMax {
			early = true
			return false
		}
		return true
	})
	if !early {
		next = "" // the range is read to its end
	}
	return out, next, err
}

// dlRow is a dead letter as the page shows it.
type dlRow struct {
	deadLetter
	ID      string
	Event   string // the decoded event, indented JSON (cut); empty when it does not decode
	Preview []byte // the first bytes of the original
	Size    int
	Headers []kgo.RecordHeader
}

func (s *Server) dlRow(d *deadLetter) dlRow {
	r := dlRow{deadLetter: *d, ID: d.id(), Size: len(d.Value), Preview: d.Value[:min(len(d.Value), dlPreviewBytes)]}
	for _, h := range d.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: cut(h.Key, dlHeaderBytes), Value: []byte(cut(string(h.Value), dlHeaderBytes))})
	}
	st := replay.Decode(s.codec, d.record(), topicspec.DeadLetter)
	if st.Event != nil {
		b, _ := json.MarshalIndent(st.Event, "", "  ")
		r.Event = cut(string(b), dlEventBytes)
	}
	r.Value, r.Key, r.Message, r.TaskID = nil, nil, cut(r.Message, dlHeaderBytes), cut(r.TaskID, dlHeaderBytes)
	return r
}

// cut shortens s to at most n bytes, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// record rebuilds the Kafka record of a dead letter.
func (d *deadLetter) record() *kgo.Record {
	return &kgo.Record{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset, Timestamp: d.Time, Key: d.Key, Value: d.Value,
		Headers: d.Headers}
}

func (s *Server) deadLetterPage(w http.ResponseWriter, r *http.Request, p *person) error {
	q := r.URL.Query()
	f, err := dlFilterOf(q.Get)
	if err != nil {
		return err
	}
	ds, next, err := s.deadLetters(&f, dlPage, q.Get("after"))
	if err != nil {
		return err
	}
	rows := make([]dlRow, len(ds))
	classes, kinds := map[string]bool{}, map[string]bool{}
	for i := range ds {
		rows[i] = s.dlRow(&ds[i])
		classes[ds[i].Class], kinds[ds[i].ErrorKind] = true, true
	}
	s.render(w, r, p, "deadletter", http.StatusOK, "Dead letter", "deadletter", map[string]any{
		"Rows": rows, "Next": next, "Filter": f, "Operator": p.operator(), "Jobs": s.jobs.list(),
		"Rate": s.cfg.RedriveRate, "MaxRedrives": s.cfg.MaxRedrives,
	})
	return nil
}

// selection resolves a re-drive form to its dead letters: the ids picked by
// hand, or everything the filter matches up to bound (the preview's time:
// a dead letter that arrives after the preview is not in it).
func (s *Server) selection(r *http.Request, bound time.Time) ([]deadLetter, string, error) {
	if r.PostFormValue("select") == "filter" {
		f, err := dlFilterOf(r.PostFormValue)
		if err != nil {
			return nil, "", err
		}
		if f.until.IsZero() || f.until.After(bound) {
			f.until = bound
		}
		ds, next, err := s.deadLetters(&f, maxRedrive, "")
		if err == nil && next != "" {
			err = badRequest(fmt.Sprintf("The filter selects more than %d dead letters, or its time range holds more than %d to look through: a re-drive takes at most %d. Narrow it (time range, class, model).",
				maxRedrive, dlScanMax, maxRedrive))
		}
		desc := fmt.Sprintf("filter class=%s kind=%s model=%s task=%s since=%s until=%s", f.Class, f.Kind, f.Model, f.Task, f.Since, f.Until)
		return ds, desc, err
	}
	ids := r.PostForm["id"]
	if len(ids) == 0 {
		return nil, "", badRequest("Nothing selected: tick records, or choose all matching the filter.")
	}
	if len(ids) > maxRedrive {
		return nil, "", badRequest(fmt.Sprintf("%d records picked: a re-drive takes at most %d.", len(ids), maxRedrive))
	}
	var out []deadLetter
	for _, id := range ids {
		parts := strings.Split(id, "/")
		if len(parts) != 3 {
			return nil, "", badRequest(fmt.Sprintf("Unknown record %q.", id))
		}
		p, err1 := strconv.Atoi(parts[1])
		off, err2 := strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, "", badRequest(fmt.Sprintf("Unknown record %q.", id))
		}
		d, err := s.findDeadLetter(parts[0], int32(p), off)
		if err != nil {
			return nil, "", err
		}
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b deadLetter) int { return strings.Compare(a.key(), b.key()) })
	return out, fmt.Sprintf("%d records picked by hand", len(out)), nil
}

func (s *Server) findDeadLetter(topic string, partition int32, offset int64) (*deadLetter, error) {
	id := (&deadLetter{Topic: topic, Partition: partition, Offset: offset}).id()
	var key string
	b, closer, err := s.view.db.Get([]byte("dli/" + id))
	if err == nil {
		key = string(b)
		closer.Close()
	}
	var d deadLetter
	if key != "" {
		var ok bool
		if ok, err = s.view.get(key, &d); err != nil {
			return nil, err
		} else if ok {
			return &d, nil
		}
	}
	return nil, notFound(fmt.Sprintf("No dead letter at %s/%d@%d.", topic, partition, offset))
}

// Bounds of the dead-letter page: records a page, and what it shows of one
// record; the original bytes are a download (/deadletter/raw).
const (
	dlPage         = 200
	dlPreviewBytes = 512
	dlEventBytes   = 8 << 10
	dlHeaderBytes  = 1 << 10
)

// deadLetterRaw serves a dead letter's original bytes as a download.
func (s *Server) deadLetterRaw(w http.ResponseWriter, r *http.Request, p *person) error {
	parts := strings.Split(r.URL.Query().Get("id"), "/")
	if len(parts) != 3 {
		return badRequest("Which record? Give id=topic/partition/offset.")
	}
	part, err1 := strconv.Atoi(parts[1])
	off, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return badRequest(fmt.Sprintf("Unknown record %q.", r.URL.Query().Get("id")))
	}
	d, err := s.findDeadLetter(parts[0], int32(part), off)
	if err != nil {
		return err
	}
	// the raw record may hold a person's input: who downloaded it is logged
	if err := s.record(r.Context(), opAction{Action: "deadletter_raw", User: p.Name, What: "downloaded dead letter " + r.URL.Query().Get("id"),
		Tasks: []string{d.TaskID}}); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="deadletter-%d-%d.bin"`, part, off))
	w.Header().Set("Cache-Control", "no-store")
	w.Write(d.Value)
	return nil
}

// plan is the dry run of a selection re-driven by operator.
func (s *Server) plan(ds []deadLetter, reason, operator string) ([]control.Redrive, error) {
	found := make([]replay.Found, len(ds))
	for i := range ds {
		rec := ds[i].record()
		found[i] = replay.Found{Rec: rec, Step: replay.Decode(s.codec, rec, topicspec.DeadLetter)}
	}
	return control.PlanRedrive(s.codec, found, s.topic(topicspec.Ingress), control.RedriveOptions{MaxRedrives: s.cfg.MaxRedrives, Reason: reason, Operator: operator})
}

// maxRedrive is the most dead letters one re-drive takes.
const maxRedrive = 10_000

// redrivePost previews a re-drive (the dry run), which fixes the selection
// (a signed digest of its records and the preview's time as its bound), or,
// confirmed, starts a job of exactly that selection, once.
func (s *Server) redrivePost(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "re-driving"); err != nil {
		return err
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		return badRequest("A reason is required for a re-drive: the job records who ran it and why.")
	}
	rate := s.cfg.RedriveRate
	if v := strings.TrimSpace(r.PostFormValue("rate")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > s.cfg.MaxRedriveRate {
			return badRequest(fmt.Sprintf("Rate %q: give records per second from 1 to %d (the ceiling of this console).", v, s.cfg.MaxRedriveRate))
		}
		rate = n
	}
	set, run := r.PostFormValue("set"), r.PostFormValue("run") != ""
	bound := time.Now()
	if run {
		b, err := strconv.ParseInt(r.PostFormValue("bound"), 10, 64)
		if set == "" || err != nil {
			return badRequest("Refused: a re-drive runs only from its preview. Preview first.")
		}
		bound = time.UnixMilli(b)
	}
	ds, desc, err := s.selection(r, bound)
	if err != nil {
		return err
	}
	ids := make([]string, len(ds))
	for i := range ds {
		ids[i] = ds[i].id()
	}
	// what the signature fixes: who (in setSig), why, how fast, and exactly which records
	fields := []string{reason, strconv.Itoa(rate), strconv.FormatInt(bound.UnixMilli(), 10), desc, digest(ids)}
	if run {
		if err := s.checkSet(r.PostFormValue("sig"), "redrive", p.Name, set, fields...); err != nil {
			if strings.Contains(err.Error(), "does not match") {
				return conflict("Refused: the selection changed since the preview (records were added within its range or removed). Preview again.")
			}
			return err
		}
	}
	plan, err := s.plan(ds, reason, p.Name)
	if err != nil {
		return err
	}
	send := control.Sendable(plan)
	if !run {
		set = newSet(bound)
		var lines []map[string]any
		refused := 0
		for i := range plan {
			x := &plan[i]
			line := map[string]any{"At": x.At(), "Task": x.Step.TaskID, "Count": x.Count}
			switch {
			case x.Refused != nil:
				line["Refused"] = x.Refused.Error()
				refused++
			case x.Out == nil:
				line["Refused"] = "skipped: " + x.Skipped
			}
			if len(lines) < 50 {
				lines = append(lines, line)
			}
		}
		hidden := url.Values{}
		for _, k := range []string{"select", "since", "until", "class", "kind", "model", "task"} {
			hidden.Set(k, r.PostFormValue(k))
		}
		hidden.Set("set", set)
		hidden.Set("sig", s.setSig("redrive", p.Name, set, fields...))
		hidden.Set("bound", strconv.FormatInt(bound.UnixMilli(), 10))
		s.render(w, r, p, "deadletter", http.StatusOK, "Re-drive", "deadletter", map[string]any{
			"Preview": map[string]any{"Send": len(send), "Refused": refused, "Total": len(plan), "Lines": lines, "Desc": desc,
				"Reason": reason, "Rate": rate, "IDs": r.PostForm["id"], "Hidden": hidden},
			"Operator": p.operator(), "Jobs": s.jobs.list(), "MaxRedrives": s.cfg.MaxRedrives, "Rate": rate,
		})
		return nil
	}
	if len(send) == 0 {
		return badRequest("Nothing to re-drive: the loop guard refused every selected record.")
	}
	if err := s.useSet(r.Context(), set, p.Name); err != nil {
		return err
	}
	var tasks []string
	seen := map[string]bool{}
	for _, x := range plan {
		if x.Out != nil && x.Refused == nil && x.Step.TaskID != "" && !seen[x.Step.TaskID] {
			seen[x.Step.TaskID] = true
			tasks = append(tasks, x.Step.TaskID)
		}
	}
	// the operator log first: a re-drive that cannot be logged does not start
	if err := s.record(r.Context(), opAction{Action: "redrive", User: p.Name, What: fmt.Sprintf("re-drive of %d records (%s), selection %s", len(send), desc, set),
		Why: reason, Set: set, Tasks: tasks}); err != nil {
		return err
	}
	j := s.jobs.start(p.Name, reason, desc, rate, send, len(plan)-len(send))
	s.log.Info("console: re-drive job started", "job", j.ID, "set", set, "records", len(send), "by", p.Name)
	s.done(w, r, "/deadletter", url.Values{"done": {"job"}, "task": {j.ID}})
	return nil
}
