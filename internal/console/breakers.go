package console

// breakers.go: every breaker the alerts topic has told of, per scope and
// key: its state, its last transitions and failure rates, why it opened,
// when it next lets a probe through, and how many due retries it holds.
// An operator resets one with a reason (the same record `faultrouter breaker
// reset` writes, to every decisions partition).

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
)

// breakerRow is a breaker as the page shows it.
type breakerRow struct {
	breakerView
	Rate      string
	NextProbe string
	Held      int
}

// cooldown is the policy's cooldown of a scope.
func (s *Server) cooldown(scope string) time.Duration {
	b := s.cfg.Policy.Breakers
	ms := b.ProviderModel.CooldownMs
	switch scope {
	case breaker.Downstream.String():
		ms = b.Downstream.CooldownMs
	case breaker.PromptTemplate.String():
		ms = b.PromptTemplate.CooldownMs
	}
	return time.Duration(ms) * time.Millisecond
}

// held counts the due retries not yet published, per SCOPE/key: what the
// router holds while a breaker they would go into is open.
func (s *Server) held(now time.Time) (map[string]int, error) {
	out := map[string]int{}
	err := s.view.each("due/", false, func(_ string, val []byte) bool {
		var p pendingRetry
		if json.Unmarshal(val, &p) == nil && !p.NotBefore.After(now) {
			for _, ref := range p.Refs {
				out[ref]++
			}
		}
		return true
	})
	return out, err
}

func (s *Server) breakerRows(now time.Time) ([]breakerRow, error) {
	held, err := s.held(now)
	if err != nil {
		return nil, err
	}
	var rows []breakerRow
	err = s.view.each("brk/", false, func(_ string, val []byte) bool {
		var b breakerView
		if json.Unmarshal(val, &b) != nil {
			return true
		}
		r := breakerRow{breakerView: b, Rate: b.failureRate()}
		if b.State != breaker.Closed.String() {
			r.Held = held[b.Scope+"/"+b.Key]
		}
		switch {
		case b.State == breaker.Open.String() && b.Latched:
			r.NextProbe = "latched until a person resets it"
		case b.State == breaker.Open.String():
			at := b.OpenedAt.Add(s.cooldown(b.Scope))
			r.NextProbe = at.UTC().Format("15:04:05Z") + " (in " + roundDur(at.Sub(now)) + ")"
			if !at.After(now) {
				r.NextProbe = at.UTC().Format("15:04:05Z") + " (due: the next retry or outcome probes)"
			}
		case b.State == breaker.HalfOpen.String():
			r.NextProbe = "now: probing"
		}
		rows = append(rows, r)
		return true
	})
	order := map[string]int{breaker.Open.String(): 0, breaker.HalfOpen.String(): 1, breaker.Closed.String(): 2}
	slices.SortFunc(rows, func(a, b breakerRow) int {
		if c := cmp.Compare(order[a.State], order[b.State]); c != 0 {
			return c
		}
		return cmp.Compare(a.Scope+"/"+a.Key, b.Scope+"/"+b.Key)
	})
	return rows, err
}

func (s *Server) breakersPage(w http.ResponseWriter, r *http.Request, p *person) error {
	rows, err := s.breakerRows(time.Now())
	if err != nil {
		return err
	}
	s.render(w, r, p, "breakers", http.StatusOK, "Breakers", "breakers", map[string]any{"Rows": rows, "Operator": p.operator()})
	return nil
}

func (s *Server) breakerReset(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "resetting a breaker"); err != nil {
		return err
	}
	scope, err := breaker.ParseScope(r.PostFormValue("scope"))
	if err != nil {
		return badRequest(fmt.Sprintf("Unknown scope %q: PROVIDER_MODEL, DOWNSTREAM or PROMPT_TEMPLATE.", r.PostFormValue("scope")))
	}
	key, reason := r.PostFormValue("key"), strings.TrimSpace(r.PostFormValue("reason"))
	switch {
	case key == "":
		return badRequest("Which breaker? The form names no key.")
	case reason == "":
		return badRequest("A reason is required to reset a breaker: it goes on the alerts topic with your name.")
	}
	// the operator log first: a reset that cannot be logged is not sent
	if err := s.record(r.Context(), opAction{Action: "breaker_reset", User: p.Name, What: scope.String() + "/" + key, Why: reason}); err != nil {
		return err
	}
	n, err := control.ResetBreaker(r.Context(), s.cfg.Kafka, s.codec, control.Topics{Decisions: s.topic("decisions"), Breakers: s.topic("breakers")}, control.Reset{Scope: scope, Key: key, Reason: reason, Operator: p.Name})
	if err != nil {
		return err
	}
	s.log.Info("console: breaker reset sent", "scope", scope.String(), "key", key, "operator", p.Name)
	s.done(w, r, "/breakers", url.Values{"done": {"reset"}, "task": {scope.String() + "/" + key}, "n": {strconv.Itoa(n)}})
	return nil
}
