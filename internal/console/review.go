package console

// review.go: the review queue. Open items, overdue first, with each owner's
// open and overdue counts; approve, or reject after the end-user message is
// shown; bulk decisions on a filter after a preview of the count. A decision
// is a record on the decisions topic; the item stays in the queue, marked
// decided, until the router's audit record for it appears.

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// reviewFilter selects items.
type reviewFilter struct {
	Owner, Class string
}

// row is one item as the queue shows it.
type row struct {
	*reviewItem
	Due       time.Time
	Overdue   bool
	CanDecide bool
	// DecidedBy is set once someone decided the item; the router has not
	// audited the decision yet.
	DecidedBy string
	Approved  bool
	// Claim is the live claim on the item; Mine when p holds it. Someone
	// else's claim takes CanDecide away.
	Claim               *claim
	Mine                bool
	CanClaim, CanAssign bool
	// Assignees are the reviewers an operator may assign the item to.
	Assignees []string
	// Latch is, on an item of a hallucination whose template is latched,
	// what deciding it does to the template
	Latch *latchNote
}

// latchNote says what deciding a hallucination's item does to its latched
// prompt template: the router reopens it once no other item of a
// hallucination of it is open (Others 0), else Others items keep it
// offline.
type latchNote struct {
	Template string
	Others   int
}

// latchNotes sets the latch note of each row of a hallucination whose
// template is latched, from the count of the template's open hallucination
// items no one decided yet kept in the view (a page reads no other item,
// however many a bad rollout opened).
func (s *Server) latchNotes(rows []row) error {
	latched := map[string]bool{}
	open := map[string]int{}
	for i := range rows {
		r := &rows[i]
		if r.Class != string(event.ClassHallucination) || r.Template == "" {
			continue
		}
		l, seen := latched[r.Template]
		if !seen {
			var b breakerView
			ok, err := s.view.get("brk/"+breaker.PromptTemplate.String()+"/"+r.Template, &b)
			if err != nil {
				return err
			}
			l = ok && b.State == breaker.Open.Name() && b.Latched
			latched[r.Template] = l
			if l {
				var n int
				if _, err := s.view.get(countTemplate+r.Template, &n); err != nil {
					return err
				}
				open[r.Template] = n
			}
		}
		if !l {
			continue
		}
		others := open[r.Template]
		if r.DecidedBy == "" {
			others-- // the item itself
		}
		r.Latch = &latchNote{Template: r.Template, Others: max(others, 0)}
	}
	return nil
}

// ownerCount is one owner's open and overdue items; OverdueMore when the
// overdue items were counted only up to maxOverdueScan.
type ownerCount struct {
	Owner         string
	Open, Overdue int
	OverdueMore   bool
}

// maxQueueScan bounds the queue index entries one page reads to find its
// items; maxOverdueScan the overdue ones it counts; maxCounted the owners
// and classes it lists.
const (
	maxQueueScan   = 20_000
	maxOverdueScan = 20_000
	maxCounted     = 1_000
)

// queueCounts returns each owner's open and overdue items, by owner, and
// the open items by class: the open counts are kept in the view as items
// open and close; the overdue ones are the queue index's entries due before
// now (it is in due order), counted up to maxOverdueScan.
func (s *Server) queueCounts(now time.Time) ([]ownerCount, map[string]int, error) {
	var owners []ownerCount
	at := map[string]int{}
	err := s.view.each(countOwner, false, func(k string, val []byte) bool {
		var n int
		if json.Unmarshal(val, &n) == nil {
			at[k[len(countOwner):]] = len(owners)
			owners = append(owners, ownerCount{Owner: k[len(countOwner):], Open: n})
		}
		return len(owners) < maxCounted
	})
	if err != nil {
		return nil, nil, err
	}
	classes := map[string]int{}
	err = s.view.each(countClass, false, func(k string, val []byte) bool {
		var n int
		if json.Unmarshal(val, &n) == nil {
			classes[k[len(countClass):]] = n
		}
		return len(classes) < maxCounted
	})
	if err != nil {
		return nil, nil, err
	}
	scanned := 0
	err = s.view.eachRange("q/", "q/"+timeKey(now.UnixMilli()), false, func(_ string, val []byte) bool {
		if i, ok := at[parseQueueEntry(val).Owner]; ok {
			owners[i].Overdue++
		}
		scanned++
		return scanned < maxOverdueScan
	})
	if scanned >= maxOverdueScan {
		for i := range owners {
			owners[i].OverdueMore = true
		}
	}
	return owners, classes, err
}

// queuePage is the number of items on one page of the queue.
const queuePage = 100

// queueScan walks the queue index in due order from the key from
// (exclusive; "" for the start), calling fn with each open item's key,
// task, due time and entry until fn returns false.
func (s *Server) queueScan(from string, fn func(key, task string, due time.Time, e queueEntry) bool) error {
	lo := "q/"
	if from > lo {
		lo = from + "\x00"
	}
	return s.view.eachRange(lo, "q0", false, func(k string, val []byte) bool {
		task, due, ok := parseQueueKey(k)
		if !ok {
			return true
		}
		return fn(k, task, due, parseQueueEntry(val))
	})
}

// parseQueueKey reads a queue key, q/<due ms, 16 hex digits>/<task>.
func parseQueueKey(k string) (task string, due time.Time, ok bool) {
	rest := strings.TrimPrefix(k, "q/")
	if len(rest) < 18 {
		return "", time.Time{}, false
	}
	ms, err := strconv.ParseUint(rest[:16], 16, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return rest[17:], time.UnixMilli(int64(ms)), true
}

// queueScanRange walks the open items due from lo to hi (queue keys), in
// due order, until fn returns false.
func (s *Server) queueScanRange(lo, hi string, fn func(task string, due time.Time) bool) error {
	return s.view.eachRange(lo, hi, false, func(k string, _ []byte) bool {
		task, due, ok := parseQueueKey(k)
		if !ok {
			return true
		}
		return fn(task, due)
	})
}

// openItems returns the open items of the filter by due time, at most
// limit.
func (s *Server) openItems(f reviewFilter, limit int) ([]reviewItem, error) {
	var out []reviewItem
	var ierr error
	err := s.queueScan("", func(_, task string, _ time.Time, e queueEntry) bool {
		if !f.matchEntry(e) {
			return true
		}
		var it reviewItem
		if ok, err := s.view.get("rev/"+task, &it); err != nil {
			ierr = err
			return false
		} else if ok && it.open() {
			out = append(out, it)
		}
		return len(out) < limit
	})
	if err == nil {
		err = ierr
	}
	return out, err
}

func (f reviewFilter) matchEntry(e queueEntry) bool {
	return (f.Owner == "" || e.Owner == f.Owner) && (f.Class == "" || e.Class == f.Class)
}

// recentlyClosed returns up to n closed items, newest first.
func (s *Server) recentlyClosed(n int) ([]reviewItem, error) {
	var out []reviewItem
	var ierr error
	err := s.view.each("cls/", true, func(k string, _ []byte) bool {
		rest := strings.TrimPrefix(k, "cls/")
		if len(rest) < 18 {
			return true
		}
		var it reviewItem
		if ok, err := s.view.get("rev/"+rest[17:], &it); err != nil {
			ierr = err
			return false
		} else if ok && !it.open() && it.Closed != nil {
			out = append(out, it)
		}
		return len(out) < n
	})
	if err == nil {
		err = ierr
	}
	return out, err
}

func (s *Server) rowOf(it *reviewItem, p *person, now time.Time) row {
	r := row{reviewItem: it, Due: it.dueAt(), CanDecide: p.canDecide(it.Owner)}
	r.Overdue = r.Due.Before(now)
	if c, ok := s.sentOf(it); ok {
		r.DecidedBy, r.Approved = c.By, c.Approve
	}
	if d := it.decided(); d != nil {
		r.DecidedBy, r.Approved = d.Reviewer, d.Approve
	}
	if c, ok := s.claimOn(it, now); ok && r.DecidedBy == "" {
		r.Claim = &c
		r.Mine = c.Holder == p.Name
		r.CanDecide = r.CanDecide && r.Mine
	}
	r.CanClaim = p.reviewer() && p.canDecide(it.Owner) && r.DecidedBy == "" && (r.Claim == nil || r.Mine)
	r.CanAssign = p.operator() && r.DecidedBy == ""
	return r
}

func (s *Server) reviewPage(w http.ResponseWriter, r *http.Request, p *person) error {
	q := r.URL.Query()
	f := reviewFilter{Owner: q.Get("owner"), Class: q.Get("class")}
	after := q.Get("after")
	if !strings.HasPrefix(after, "q/") {
		after = ""
	}
	now := time.Now()
	owners, classes, err := s.queueCounts(now)
	if err != nil {
		return err
	}
	// a page of the filter's items from after: at most maxQueueScan index
	// entries read (a filter that matches few items goes on from where the
	// page stopped)
	var page []string
	next, scanned, more := "", 0, false
	err = s.queueScan(after, func(k, task string, _ time.Time, e queueEntry) bool {
		scanned++
		if f.matchEntry(e) {
			if len(page) == queuePage {
				more = true // there is a next page
				return false
			}
			page = append(page, task)
		}
		next = k
		if scanned >= maxQueueScan {
			more = true // looked through enough: the next page goes on from here
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	if !more {
		next = "" // the index ended
	}
	total := ""
	switch {
	case f.Owner == "" && f.Class == "":
		n := 0
		for _, oc := range owners {
			n += oc.Open
		}
		total = strconv.Itoa(n)
	case f.Class == "":
		for _, oc := range owners {
			if oc.Owner == f.Owner {
				total = strconv.Itoa(oc.Open)
			}
		}
	case f.Owner == "":
		total = strconv.Itoa(classes[f.Class])
	}
	rows := make([]row, 0, len(page))
	for _, task := range page {
		var it reviewItem
		if ok, err := s.view.get("rev/"+task, &it); err != nil {
			return err
		} else if ok && it.open() {
			rows = append(rows, s.rowOf(&it, p, now))
		}
	}
	if err := s.latchNotes(rows); err != nil {
		return err
	}
	closed, err := s.recentlyClosed(20)
	if err != nil {
		return err
	}
	progress, err := s.progressOf(now)
	if err != nil {
		return err
	}
	if p.operator() {
		s.fillAssignees(rows)
	}
	s.render(w, r, p, "review", http.StatusOK, "Review queue", "review", map[string]any{
		"Rows": rows, "Owners": owners, "Classes": slices.Sorted(maps.Keys(classes)), "Filter": f, "Closed": closed,
		"Reviewer": p.reviewer(), "Total": total, "Next": next, "First": after != "",
		"Progress": progress,
	})
	return nil
}

// sentOf returns the decision this replica sent for the item's current
// opening, if the view has not read it back yet.
func (s *Server) sentOf(it *reviewItem) (sentDecision, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.sent[it.TaskID]
	if !ok || c.At.Before(it.OpenedAt) {
		return sentDecision{}, false
	}
	return c, true
}

// checkDecidable says why p may not decide the task's item now, nil when
// they may. Called with s.mu held.
func (s *Server) checkDecidable(p *person, it *reviewItem, found bool, task string) error {
	switch {
	case !found || it.OpenedAt.IsZero():
		return notFound(fmt.Sprintf("Unknown task %q: it has no review item.", task))
	case !it.open():
		by := ""
		if it.Decision != nil && !it.Decision.At.Before(it.OpenedAt) {
			by = " by " + it.Decision.Reviewer
		}
		return conflict(fmt.Sprintf("Task %s is already decided%s: the router closed its item at %s (%s).",
			task, by, it.ClosedAt.UTC().Format(time.RFC3339), it.Closed.Rule))
	}
	if d := it.decided(); d != nil {
		return conflict(fmt.Sprintf("Refused: %s already decided task %s at %s (%s); the router has not closed the item yet. A second decision would be ignored.",
			d.Reviewer, task, d.At.UTC().Format(time.RFC3339), verdict(d.Approve)))
	}
	if c, ok := s.sent[task]; ok && !c.At.Before(it.OpenedAt) {
		return conflict(fmt.Sprintf("Refused: %s already decided task %s at %s (%s); the router has not closed the item yet. A second decision would be ignored.",
			c.By, task, c.At.UTC().Format(time.RFC3339), verdict(c.Approve)))
	}
	if !p.reviewer() {
		return forbidden(fmt.Sprintf("Refused: %s may view only; deciding needs the reviewer role.", p.Name))
	}
	if !p.canDecide(it.Owner) {
		return forbidden(fmt.Sprintf("Refused: task %s belongs to owner %s; %s reviews for %s.", task, it.Owner, p.Name, strings.Join(p.Owners, ", ")))
	}
	return s.heldByOther(p, it, time.Now(), "decide")
}

func verdict(approve bool) string {
	if approve {
		return "approved"
	}
	return "rejected"
}

// decide sends the decisions of p on tasks, refusing the lot when any one
// may not be decided now; once they may, logged goes to the operator log
// before any decision is sent, and none is sent when it cannot be written.
func (s *Server) decide(r *http.Request, p *person, tasks []string, approve bool, reason string, logged opAction) error {
	if strings.TrimSpace(reason) == "" {
		return badRequest("A reason is required: it goes on the audit record (and, for a reject, to the end user).")
	}
	now := time.Now()
	s.mu.Lock()
	for _, task := range tasks {
		var it reviewItem
		found, err := s.view.get("rev/"+task, &it)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		if err := s.checkDecidable(p, &it, found, task); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	for task, c := range s.sent { // the view has long read these back
		if now.Sub(c.At) > 24*time.Hour {
			delete(s.sent, task)
		}
	}
	ds := make([]event.ReviewDecision, len(tasks))
	for i, task := range tasks {
		s.sent[task] = sentDecision{By: p.Name, Approve: approve, At: now}
		ds[i] = event.ReviewDecision{TaskID: task, Approve: approve, Reason: reason, Reviewer: p.Name, At: event.At(now)}
	}
	s.mu.Unlock()
	unsend := func() {
		s.mu.Lock()
		for _, task := range tasks {
			delete(s.sent, task)
		}
		s.mu.Unlock()
	}
	if err := s.record(r.Context(), logged); err != nil {
		unsend()
		return err
	}
	if err := control.Decide(r.Context(), s.cfg.Kafka, s.codec, s.topic(topicspec.Decisions), ds...); err != nil {
		unsend()
		return fmt.Errorf("writing the decision: %w", err)
	}
	for _, task := range tasks {
		s.log.Info("console: decision sent", "task_id", task, "reviewer", p.Name, "approve", approve)
		var it reviewItem
		if ok, _ := s.view.get("rev/"+task, &it); ok {
			s.hub.publish(note{Kind: "review", Item: &it})
		}
	}
	return nil
}

// reviewDecide approves, or rejects after showing the end-user message.
func (s *Server) reviewDecide(w http.ResponseWriter, r *http.Request, p *person) error {
	task := strings.TrimSpace(r.PostFormValue("task"))
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	action := r.PostFormValue("action")
	if task == "" {
		return badRequest("Which task? The form names none.")
	}
	if action != "approve" && action != "reject" {
		return badRequest(fmt.Sprintf("Unknown action %q: approve or reject.", action))
	}
	if reason == "" {
		return badRequest("A reason is required: it goes on the audit record (and, for a reject, to the end user).")
	}
	if action == "reject" && r.PostFormValue("confirm") == "" {
		s.mu.Lock()
		var it reviewItem
		found, err := s.view.get("rev/"+task, &it)
		if err == nil {
			err = s.checkDecidable(p, &it, found, task)
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		s.render(w, r, p, "confirm", http.StatusOK, "Reject", "review", map[string]any{
			"Kind": "reject", "Task": task, "Reason": reason, "Item": it,
			"Message": s.cfg.Policy.UserMessage(reason),
		})
		return nil
	}
	if err := s.decide(r, p, []string{task}, action == "approve", reason,
		opAction{Action: action, User: p.Name, What: "task " + task, Why: reason, Tasks: []string{task}}); err != nil {
		return err
	}
	s.done(w, r, "/review", url.Values{"done": {action}, "task": {task}})
	return nil
}

// reviewBulk decides the items of a filter: first a preview that fixes
// the exact items (a signed list), then, confirmed, the decisions of those
// items only; an item that arrived since is not decided, one decided by
// someone else since is skipped, and the same confirmation twice is refused.
func (s *Server) reviewBulk(w http.ResponseWriter, r *http.Request, p *person) error {
	f := reviewFilter{Owner: r.PostFormValue("owner"), Class: r.PostFormValue("class")}
	action, reason := r.PostFormValue("action"), strings.TrimSpace(r.PostFormValue("reason"))
	if action != "approve" && action != "reject" {
		return badRequest(fmt.Sprintf("Unknown action %q: approve or reject.", action))
	}
	if reason == "" {
		return badRequest("A reason is required for a bulk decision.")
	}
	if set := r.PostFormValue("set"); set != "" {
		return s.bulkConfirm(w, r, p, set, action, reason)
	}
	items, err := s.openItems(f, 10*maxBulk)
	if err != nil {
		return err
	}
	var tasks []string
	skipped := 0
	s.mu.Lock()
	for i := range items {
		it := &items[i]
		if s.checkDecidable(p, it, true, it.TaskID) != nil {
			skipped++
			continue
		}
		tasks = append(tasks, it.TaskID)
	}
	s.mu.Unlock()
	if len(tasks) == 0 {
		return badRequest(fmt.Sprintf("No item of this filter can be decided by %s now (%d open items are decided already, belong to other owners or are held by someone else).", p.Name, skipped))
	}
	if len(tasks) > maxBulk {
		return badRequest(fmt.Sprintf("%d items: a bulk decision takes at most %d. Narrow the filter (owner, class).", len(tasks), maxBulk))
	}
	set := newSet(time.Now())
	data := map[string]any{"Kind": "bulk", "Action": action, "Reason": reason, "Filter": f, "Count": len(tasks),
		"Skipped": skipped, "Tasks": tasks, "Set": set, "Sig": s.setSig("bulk", p.Name, set, action, reason, strings.Join(tasks, "\n"))}
	if action == "reject" {
		data["Message"] = s.cfg.Policy.UserMessage(reason)
	}
	s.render(w, r, p, "confirm", http.StatusOK, "Bulk decision", "review", data)
	return nil
}

// maxBulk is the most items one bulk decision takes.
const maxBulk = 1000

func (s *Server) bulkConfirm(w http.ResponseWriter, r *http.Request, p *person, set, action, reason string) error {
	tasks := r.PostForm["task"]
	if err := s.checkSet(r.PostFormValue("sig"), "bulk", p.Name, set, action, reason, strings.Join(tasks, "\n")); err != nil {
		return err
	}
	if err := s.useSet(r.Context(), set, p.Name); err != nil {
		return err
	}
	var decidable []string
	s.mu.Lock()
	for _, task := range tasks {
		var it reviewItem
		found, err := s.view.get("rev/"+task, &it)
		if err == nil && s.checkDecidable(p, &it, found, task) == nil {
			decidable = append(decidable, task)
		}
	}
	s.mu.Unlock()
	if len(decidable) == 0 {
		return conflict("None of the previewed items can be decided now: they were decided or closed since the preview.")
	}
	if err := s.decide(r, p, decidable, action == "approve", reason, opAction{Action: "bulk_" + action, User: p.Name,
		What: fmt.Sprintf("%d items", len(decidable)), Why: reason, Tasks: decidable, Set: set}); err != nil {
		return err
	}
	s.done(w, r, "/review", url.Values{"done": {"bulk"}, "n": {strconv.Itoa(len(decidable))},
		"skipped": {strconv.Itoa(len(tasks) - len(decidable))}})
	return nil
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
