package console

// claims.go: claiming and assigning review items. A reviewer claims an item
// to work on it; an operator assigns an item to a reviewer who may decide
// it. A claim names its holder and ends by itself ClaimTTL after it was
// taken; while it holds, the queue shows the holder to everyone and no one
// else may decide, claim or release the item (an operator may assign it
// over the claim). Deciding needs no claim.
//
// A claim, an assignment and a release are records on the console topic,
// like the sign-outs: every replica reads them in the topic's order and
// applies the same rule, the first live claim wins, so replicas agree on
// the holder. The handler waits until this replica has read its own record
// back before answering, and answers with what the topic decided: two
// reviewers who claim the same item at once on two replicas are told which
// of them holds it. The records are operator actions too: they appear in
// the operator log and on the task's timeline.
//
// Progress per reviewer: decisions taken today (UTC, from the operator
// log: console decisions only), open claims, and claims past the item's SLA.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// claim is who holds a review item and until when.
type claim struct {
	Holder string    // who holds the item
	By     string    // who claimed or assigned it
	At     time.Time // when
	Until  time.Time // when it ends by itself
}

// live reports whether the claim holds at t.
func (c claim) live(t time.Time) bool { return c.Holder != "" && c.Until.After(t) }

// Claim actions on the console topic.
const (
	actClaim   = "claim"
	actAssign  = "assign"
	actRelease = "release"
	// actLease is not an operator action: a replica takes the sending of a
	// webhook notice (notify.go), by the claims' rule.
	actLease = "notify_lease"
)

// DefaultClaimTTL and MaxClaimTTL bound Config.ClaimTTL.
const (
	DefaultClaimTTL = 30 * time.Minute
	MaxClaimTTL     = 12 * time.Hour
)

// applyClaim applies a claim, assignment or release read from the console
// topic. Every replica applies the same records in the same order, and the
// rule looks only at the records' own times, so all agree.
func (s *Server) applyClaim(a *opAction) {
	if len(a.Tasks) != 1 || a.Holder == "" {
		return
	}
	task := a.Tasks[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.Action == actLease { // notify.go: which replica sends a notice
		if cur := s.leases[task]; !cur.live(a.At) || cur.Holder == a.Holder {
			s.leases[task] = claim{Holder: a.Holder, By: a.User, At: a.At, Until: a.Until}
		}
		for k, c := range s.leases {
			if !c.live(a.At) {
				delete(s.leases, k)
			}
		}
		return
	}
	cur := s.claims[task]
	switch a.Action {
	case actClaim:
		if cur.live(a.At) && cur.Holder != a.Holder {
			return // someone else's claim came first
		}
		s.claims[task] = claim{Holder: a.Holder, By: a.User, At: a.At, Until: a.Until}
	case actAssign:
		s.claims[task] = claim{Holder: a.Holder, By: a.User, At: a.At, Until: a.Until}
	case actRelease:
		if cur.Holder == a.Holder && !cur.At.After(a.At) {
			delete(s.claims, task)
		}
	}
	defer s.publishItem(task) // open pages show the holder
	if len(s.claims) > 1000 && a.At.Sub(s.claimsPruned) > time.Minute {
		s.claimsPruned = a.At
		for k, c := range s.claims {
			if !c.live(a.At) {
				delete(s.claims, k)
			}
		}
	}
}

// publishItem tells the open pages about the task's item.
func (s *Server) publishItem(task string) {
	var it reviewItem
	if ok, _ := s.view.get("rev/"+task, &it); ok {
		s.hub.publish(note{Kind: "review", Item: &it})
	}
}

// claimOn returns the live claim on the item's current opening.
func (s *Server) claimOn(it *reviewItem, now time.Time) (claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimOnLocked(it, now)
}

func (s *Server) claimOnLocked(it *reviewItem, now time.Time) (claim, bool) {
	c, ok := s.claims[it.TaskID]
	if !ok || !c.live(now) || c.At.Before(it.OpenedAt) {
		return claim{}, false
	}
	return c, true
}

// heldByOther refuses p while someone else holds the item. Called with
// s.mu held.
func (s *Server) heldByOther(p *person, it *reviewItem, now time.Time, doing string) error {
	c, ok := s.claimOnLocked(it, now)
	if !ok || c.Holder == p.Name {
		return nil
	}
	return conflict(fmt.Sprintf("Refused: %s holds task %s until %s (%s); %s may not %s it before the claim ends.",
		c.Holder, it.TaskID, c.Until.UTC().Format("15:04 UTC"), claimedHow(c), p.Name, doing))
}

func claimedHow(c claim) string {
	if c.By != c.Holder {
		return "assigned by " + c.By
	}
	return "claimed"
}

// reviewClaim claims (op=claim) or releases (op=release) a review item.
func (s *Server) reviewClaim(w http.ResponseWriter, r *http.Request, p *person) error {
	op := r.PostFormValue("op")
	if op != actClaim && op != actRelease {
		return badRequest(fmt.Sprintf("Unknown op %q: claim or release.", op))
	}
	return s.changeClaim(w, r, p, op)
}

// reviewAssign assigns a review item to the reviewer named by to.
func (s *Server) reviewAssign(w http.ResponseWriter, r *http.Request, p *person) error {
	return s.changeClaim(w, r, p, actAssign)
}

func (s *Server) changeClaim(w http.ResponseWriter, r *http.Request, p *person, op string) error {
	task := strings.TrimSpace(r.PostFormValue("task"))
	if task == "" {
		return badRequest("Which task? The form names none.")
	}
	now := time.Now()
	a := opAction{Action: op, User: p.Name, At: now, Tasks: []string{task}, Until: now.Add(s.cfg.ClaimTTL)}
	s.mu.Lock()
	var it reviewItem
	found, err := s.view.get("rev/"+task, &it)
	if err == nil {
		err = s.claimable(p, &it, found, task, now, &a, strings.TrimSpace(r.PostFormValue("to")))
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	switch op {
	case actAssign:
		a.What, a.Why = "assigned task "+task+" to "+a.Holder, strings.TrimSpace(r.PostFormValue("reason"))
	case actRelease:
		a.What = "released task " + task + " held by " + a.Holder
	default:
		a.What = "claimed task " + task
	}
	if err := s.writeAndReadBack(r.Context(), s.actionRecord(&a), "claim"); err != nil {
		return err
	}
	c, held := s.claimOn(&it, time.Now())
	switch {
	case op == actRelease && held && c.Holder == a.Holder:
		return conflict(fmt.Sprintf("Task %s is still held by %s: it was claimed again before the release arrived.", task, c.Holder))
	case op != actRelease && (!held || c.Holder != a.Holder):
		if held {
			return conflict(fmt.Sprintf("Refused: %s claimed task %s first (%s); it holds until %s.", c.Holder, task, claimedHow(c), c.Until.UTC().Format("15:04 UTC")))
		}
		return conflict(fmt.Sprintf("The claim of task %s did not hold; reload and try again.", task))
	}
	s.log.Info("console: claim", "task_id", task, "op", op, "holder", a.Holder, "by", p.Name)
	s.done(w, r, "/review", url.Values{"done": {op}, "task": {task}})
	return nil
}

// claimable says why p may not take op on the item now, filling the
// action's holder when p may. Called with s.mu held.
func (s *Server) claimable(p *person, it *reviewItem, found bool, task string, now time.Time, a *opAction, to string) error {
	switch {
	case !found || it.OpenedAt.IsZero():
		return notFound(fmt.Sprintf("Unknown task %q: it has no review item.", task))
	case !it.open():
		return conflict(fmt.Sprintf("Task %s is closed: there is nothing to claim.", task))
	case it.decided() != nil:
		d := it.decided()
		return conflict(fmt.Sprintf("Task %s is already decided by %s: there is nothing to claim.", task, d.Reviewer))
	}
	if d, ok := s.sent[task]; ok && !d.At.Before(it.OpenedAt) {
		return conflict(fmt.Sprintf("Task %s is already decided by %s: there is nothing to claim.", task, d.By))
	}
	cur, held := s.claimOnLocked(it, now)
	switch a.Action {
	case actClaim:
		if !p.canDecide(it.Owner) {
			return forbidden(fmt.Sprintf("Refused: task %s belongs to owner %s; %s reviews for %s.", task, it.Owner, p.Name, strings.Join(p.Owners, ", ")))
		}
		if err := s.heldByOther(p, it, now, "claim"); err != nil {
			return err
		}
		a.Holder = p.Name
	case actRelease:
		if !held {
			return conflict(fmt.Sprintf("Task %s is not claimed (or its claim ended).", task))
		}
		if cur.Holder != p.Name && !p.operator() {
			return forbidden(fmt.Sprintf("Refused: %s holds task %s; only the holder or an operator may release it.", cur.Holder, task))
		}
		a.Holder, a.Until = cur.Holder, time.Time{}
	case actAssign:
		if err := needOperator(p, "assigning an item"); err != nil {
			return err
		}
		u := s.users().find(to)
		if to == "" || u == nil || u.Name != to {
			return badRequest(fmt.Sprintf("Assign to whom? %q is not in the users file.", to))
		}
		q := &person{Name: u.Name, Roles: u.Roles, Owners: u.Owners}
		if !q.reviewer() || !q.canDecide(it.Owner) {
			return badRequest(fmt.Sprintf("Refused: %s may not decide task %s (owner %s): assign it to a reviewer of that owner.", u.Name, task, it.Owner))
		}
		a.Holder = u.Name
	default:
		return badRequest(fmt.Sprintf("Unknown op %q: claim, release or assign.", a.Action))
	}
	return nil
}

// writeAndReadBack writes rec (a claim, a confirmation's use) to the
// console topic and waits until this replica has read it back (and applied
// it), at most claimReadBack.
func (s *Server) writeAndReadBack(ctx context.Context, rec *kgo.Record, what string) error {
	if err := s.produce(ctx, rec); err != nil {
		s.log.Error("console: record not written to the console topic", "what", what, "key", string(rec.Key), "err", err)
		return &userError{Status: http.StatusServiceUnavailable, Msg: "The " + what + " could not be written to Kafka; nothing changed. Try again in a moment."}
	}
	deadline := time.Now().Add(claimReadBack)
	for !s.consoleReadPast(rec.Partition, rec.Offset) {
		if time.Now().After(deadline) {
			return &userError{Status: http.StatusServiceUnavailable, Msg: "The " + what + " was written but this console has not read it back yet; reload in a moment to see what it did."}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// claimReadBack bounds the wait for a claim's record to come back.
const claimReadBack = 10 * time.Second

// consoleReadPast reports whether the console topic's reader has applied
// the record at offset of partition.
func (s *Server) consoleReadPast(partition int32, offset int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.consoleNext[partition] > offset
}

// consoleRead notes that the reader applied the record at offset.
func (s *Server) consoleRead(partition int32, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.consoleNext == nil {
		s.consoleNext = map[int32]int64{}
	}
	if offset+1 > s.consoleNext[partition] {
		s.consoleNext[partition] = offset + 1
	}
}

// fillAssignees lists, for each row, the reviewers of the users file who
// may decide it: whom an operator may assign it to.
func (s *Server) fillAssignees(rows []row) {
	var reviewers []person
	if u := s.users(); u != nil {
		for _, u := range u.Users {
			if slices.Contains(u.Roles, RoleReviewer) {
				reviewers = append(reviewers, person{Name: u.Name, Roles: u.Roles, Owners: u.Owners})
			}
		}
	}
	for i := range rows {
		for _, q := range reviewers {
			if q.canDecide(rows[i].Owner) {
				rows[i].Assignees = append(rows[i].Assignees, q.Name)
			}
		}
	}
}

// reviewerProgress is one reviewer's day.
type reviewerProgress struct {
	Name                        string
	DecidedToday, Open, Overdue int
}

// decisions is how many review decisions the action sent: one for an
// approval or a rejection, the tasks of a bulk one.
func (a *opAction) decisions() int {
	switch a.Action {
	case "approve", "reject":
		return 1
	case "bulk_approve", "bulk_reject":
		return len(a.Tasks) + a.MoreTasks
	}
	return 0
}

// progressKey is the view's count of a reviewer's decisions on the UTC day
// of at: prog/<day ms:16 hex>/<user>.
func progressKey(at time.Time, user string) string {
	return "prog/" + timeKey(at.UTC().Truncate(24*time.Hour).UnixMilli()) + "/" + user
}

// progressOf counts today's console decisions per reviewer (kept as the
// operator log's records arrive: one key per reviewer and day) and the open
// and overdue claims per holder.
func (s *Server) progressOf(now time.Time) ([]reviewerProgress, error) {
	by := map[string]*reviewerProgress{}
	get := func(n string) *reviewerProgress {
		if by[n] == nil {
			by[n] = &reviewerProgress{Name: n}
		}
		return by[n]
	}
	prefix := strings.TrimSuffix(progressKey(now, ""), "/") + "/"
	err := s.view.each(prefix, false, func(k string, val []byte) bool {
		var n int
		if json.Unmarshal(val, &n) == nil {
			get(strings.TrimPrefix(k, prefix)).DecidedToday += n
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	held := make(map[string]claim, len(s.claims))
	for task, c := range s.claims {
		if c.live(now) {
			held[task] = c
		}
	}
	s.mu.Unlock()
	for task, c := range held {
		var it reviewItem
		if ok, err := s.view.get("rev/"+task, &it); err != nil {
			return nil, err
		} else if !ok || !it.open() || it.decided() != nil || c.At.Before(it.OpenedAt) {
			continue
		}
		pr := get(c.Holder)
		pr.Open++
		if it.dueAt().Before(now) {
			pr.Overdue++
		}
	}
	out := make([]reviewerProgress, 0, len(by))
	for _, pr := range by {
		out = append(out, *pr)
	}
	slices.SortFunc(out, func(a, b reviewerProgress) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// claimNote is what a review row shows about its claim.
func claimNote(m map[string]any, c claim) {
	m["holder"], m["until"] = c.Holder, c.Until.UTC().Format("15:04 UTC")
	if c.By != c.Holder {
		m["assigned_by"] = c.By
	}
}
