package console

// alerts.go: the alerts topic as a live feed, newest first: breaker
// transitions and immediate alerts (hallucination, budget exhausted, surge,
// overdue review).

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// alertRow is an alert as the feed shows it (and the live script adds it).
type alertJSON struct {
	Time     string             `json:"time"`
	Kind     string             `json:"kind"`
	Scope    event.BreakerScope `json:"scope"`
	Key      string             `json:"key"`
	Change   string             `json:"change"`
	Class    string             `json:"class"`
	TaskID   string             `json:"task_id"`
	Reason   string             `json:"reason"`
	Instance string             `json:"instance"`
}

func alertRow(a *alert) alertJSON {
	return alertJSON{Time: a.Time.UTC().Format("2006-01-02 15:04:05Z"), Kind: a.Kind, Scope: a.Scope, Key: a.Key,
		Change: strings.Trim(string(a.From)+"→"+string(a.To), "→"), Class: string(a.Class), TaskID: a.TaskID, Reason: a.Reason, Instance: a.Instance}
}

// alertsPage is the number of alerts on one page.
const alertsPage = 200

func (s *Server) alertsPage(w http.ResponseWriter, r *http.Request, p *person) error {
	hi := "alr0"
	if before := r.URL.Query().Get("before"); strings.HasPrefix(before, "alr/") {
		hi = before
	}
	var rows []alertJSON
	last, next := "", ""
	err := s.view.eachRange("alr/", hi, true, func(k string, val []byte) bool {
		if len(rows) == alertsPage {
			next = last // there is an older one
			return false
		}
		var a alert
		if json.Unmarshal(val, &a) == nil {
			rows = append(rows, alertRow(&a))
		}
		last = k
		return true
	})
	if err != nil {
		return err
	}
	s.render(w, r, p, "alerts", http.StatusOK, "Alerts", "alerts", map[string]any{"Rows": rows, "Next": next})
	return nil
}
