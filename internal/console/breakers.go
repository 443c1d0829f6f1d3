package console

// breakers.go: every breaker the alerts topic has told of, per scope and
// key, a page at a time, open ones first: its state, its last transitions
// and failure rates, why it opened, when it next lets a probe through, and
// how many due retries it holds.
// An operator resets one with a reason (the same record `faultrouter breaker
// reset` writes, to every decisions partition).

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// breakerRow is a breaker as the page shows it.
type breakerRow struct {
	breakerView
	Rate      string
	NextProbe string
	Held      int
	HeldMore  bool // Held stopped counting at maxHeldCount
}

// NotClosed reports whether the breaker is OPEN or HALF_OPEN: the page
// shows why it opened, and an operator may reset it.
func (r breakerRow) NotClosed() bool { return r.State != event.BreakerClosed }

// cooldown is the policy's cooldown of a scope.
func (s *Server) cooldown(scope event.BreakerScope) time.Duration {
	b := s.cfg.Policy.Breakers
	ms := b.ProviderModel.CooldownMs
	switch scope {
	case breaker.Downstream.Name():
		ms = b.Downstream.CooldownMs
	case breaker.PromptTemplate.Name():
		ms = b.PromptTemplate.CooldownMs
	}
	return time.Duration(ms) * time.Millisecond
}

// breakersPage is the number of breakers on one page of the Breakers page.
const breakersPage = 100

// maxHeldCount bounds the held retries counted for one breaker on a page
// (more show as that many and more).
const maxHeldCount = 1000

// heldBy counts the due retries not yet published that would go into the
// breaker ref (SCOPE/key): what the router holds while it is open. It stops
// at maxHeldCount.
func (s *Server) heldBy(ref string, now time.Time) (int, error) {
	n := 0
	prefix := dueRefKey(ref, "")
	err := s.view.eachRange(prefix, string(upper(prefix)), false, func(_ string, val []byte) bool {
		if len(val) == 8 && int64(binary.BigEndian.Uint64(val)) <= now.UnixMilli() {
			n++
		}
		return n < maxHeldCount
	})
	return n, err
}

// breakerRows returns a page of breakers, open ones first, from the index
// key after (exclusive; "" for the first page), and the key the next page
// starts after ("" on the last page).
func (s *Server) breakerRows(now time.Time, after string) ([]breakerRow, string, error) {
	var keys []string
	lo := "brks/"
	if strings.HasPrefix(after, lo) {
		lo = after + "\x00"
	}
	err := s.view.eachRange(lo, string(upper("brks/")), false, func(k string, _ []byte) bool {
		keys = append(keys, k)
		return len(keys) <= breakersPage
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(keys) > breakersPage {
		keys = keys[:breakersPage]
		next = keys[breakersPage-1]
	}
	rows := make([]breakerRow, 0, len(keys))
	for _, k := range keys {
		ref := k[len("brks/x/"):]
		var b breakerView
		if ok, err := s.view.get("brk/"+ref, &b); err != nil {
			return nil, "", err
		} else if !ok {
			continue
		}
		r := breakerRow{breakerView: b, Rate: b.failureRate()}
		if b.State != breaker.Closed.Name() {
			if r.Held, err = s.heldBy(ref, now); err != nil {
				return nil, "", err
			}
			r.HeldMore = r.Held >= maxHeldCount
		}
		switch {
		case b.State == breaker.Open.Name() && b.Latched:
			r.NextProbe = "latched until a person resets it"
		case b.State == breaker.Open.Name():
			at := b.OpenedAt.Add(s.cooldown(b.Scope))
			r.NextProbe = at.UTC().Format("15:04:05Z") + " (in " + roundDur(at.Sub(now)) + ")"
			if !at.After(now) {
				r.NextProbe = at.UTC().Format("15:04:05Z") + " (due: the next retry or outcome probes)"
			}
		case b.State == breaker.HalfOpen.Name():
			r.NextProbe = "now: probing"
		}
		rows = append(rows, r)
	}
	return rows, next, nil
}

func (s *Server) breakersPage(w http.ResponseWriter, r *http.Request, p *person) error {
	after := r.URL.Query().Get("after")
	rows, next, err := s.breakerRows(time.Now(), after)
	if err != nil {
		return err
	}
	s.render(w, r, p, "breakers", http.StatusOK, "Breakers", "breakers", map[string]any{"Rows": rows, "Operator": p.operator(),
		"Next": next, "First": strings.HasPrefix(after, "brks/")})
	return nil
}

func (s *Server) breakerReset(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "resetting a breaker"); err != nil {
		return err
	}
	scope, err := breaker.ParseScope(event.BreakerScope(r.PostFormValue("scope")))
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
	n, err := control.ResetBreaker(r.Context(), s.cfg.Kafka, s.codec, s.cfg.Topics.Topics(), control.Reset{Scope: scope, Key: key, Reason: reason, Operator: p.Name})
	if err != nil {
		return err
	}
	s.log.Info("console: breaker reset sent", "scope", scope.String(), "key", key, "operator", p.Name)
	s.done(w, r, "/breakers", url.Values{"done": {"reset"}, "task": {scope.String() + "/" + key}, "n": {strconv.Itoa(n)}})
	return nil
}
