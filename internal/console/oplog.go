package console

// oplog.go: the operator log. Every operator action (sign-in and sign-out,
// decisions and bulk decisions, breaker resets, re-drives and their job
// controls) is a record on the console topic (opAction: who, when, what,
// why, the tasks it touched). The view keeps them by time and by task: the
// operator log page lists them newest first, a page at a time, and a task's
// timeline shows the actions on that task.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// opLogPage is the number of actions on one page of the operator log.
const opLogPage = 100

// applyAction stores an operator action of the console topic.
func (s *Server) applyAction(b *batch, rec *kgo.Record) (*note, error) {
	var a opAction
	if err := json.Unmarshal(rec.Value, &a); err != nil || a.Kind != "action" || a.Action == actLease {
		return nil, err
	}
	if err := applyNotice(b, &a); err != nil {
		return nil, err
	}
	at := fmt.Sprintf("%s/%08x/%016x", timeKey(a.At.UnixMilli()), rec.Partition, rec.Offset)
	if n := a.decisions(); n > 0 {
		// the reviewers' table counts each action once, as it arrives
		if seen, err := b.get("op/"+at, nil); err != nil {
			return nil, err
		} else if !seen {
			if err := b.add(progressKey(a.At, a.User), n); err != nil {
				return nil, err
			}
		}
	}
	if err := b.put("op/"+at, a); err != nil {
		return nil, err
	}
	one := a
	for _, task := range a.Tasks {
		one.Tasks = []string{task}
		if err := b.put("opt/"+task+"/"+at, one); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// taskActions returns the operator actions on a task, oldest first, at
// most limit.
func (s *Server) taskActions(task string, limit int) ([]opAction, error) {
	var out []opAction
	err := s.view.each("opt/"+task+"/", false, func(_ string, val []byte) bool {
		var a opAction
		if json.Unmarshal(val, &a) == nil && len(a.Tasks) == 1 && a.Tasks[0] == task {
			out = append(out, a)
		}
		return len(out) < limit
	})
	return out, err
}

func (s *Server) operatorsPage(w http.ResponseWriter, r *http.Request, p *person) error {
	q := r.URL.Query()
	user := strings.TrimSpace(q.Get("user"))
	hi := "op0"
	if before := q.Get("before"); strings.HasPrefix(before, "op/") {
		hi = before
	}
	var rows []opAction
	last, next, scanned := "", "", 0
	err := s.view.eachRange("op/", hi, true, func(k string, val []byte) bool {
		var a opAction
		if json.Unmarshal(val, &a) == nil && (user == "" || a.User == user) {
			if len(rows) == opLogPage {
				next = last // there is an older one
				return false
			}
			rows = append(rows, a)
		}
		last = k
		// a filter that matches rarely still reads a bounded number of keys
		if scanned++; scanned >= 50*opLogPage {
			next = last
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	s.render(w, r, p, "operators", http.StatusOK, "Operator log", "operators", map[string]any{"Rows": rows, "User": user, "Next": next,
		"Operator": p.operator()})
	return nil
}
