package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/console"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// retryStory accounts for the demo's retry decisions: published when due,
// superseded by the task's next event before they were due, or still
// pending, and why (a breaker holding them, or not yet due).
type retryStory struct {
	decided int
	sent    int
	// lastRetry is the last audited RETRY of a task whose last decision is
	// that retry; publishedAt the time of its latest published retry.
	lastRetry   map[string]*event.Routed
	retryAt     map[string]time.Time
	publishedAt map[string]time.Time
	// breakers holds the last transition of each breaker, latched those
	// latched open (faultrouter.breaker.latched); alerts all of them.
	breakers map[string]event.BreakerEvent
	latched  map[string]bool
	alerts   []event.BreakerEvent
}

func newRetryStory() *retryStory {
	return &retryStory{lastRetry: map[string]*event.Routed{}, retryAt: map[string]time.Time{},
		publishedAt: map[string]time.Time{}, breakers: map[string]event.BreakerEvent{}, latched: map[string]bool{}}
}

func (rs *retryStory) audited(r event.Routed, at time.Time) {
	task := r.Event.TaskID
	switch r.Decision.Route {
	case event.RouteDrop:
	case event.RouteRetry:
		rs.decided++
		rs.lastRetry[task], rs.retryAt[task] = &r, at
	default:
		delete(rs.lastRetry, task)
	}
}

func (rs *retryStory) published(task string, at time.Time) {
	rs.sent++
	if at.After(rs.publishedAt[task]) {
		rs.publishedAt[task] = at
	}
}

func (rs *retryStory) alert(b event.BreakerEvent, latched bool) {
	rs.alerts = append(rs.alerts, b)
	if b.Kind == event.BreakerKindTransition {
		k := string(b.Scope) + "/" + b.Key
		if prev, ok := rs.breakers[k]; !ok || !b.At.Before(prev.At.Time) {
			rs.breakers[k] = b
			rs.latched[k] = latched
		}
	}
}

// print says what became of every retry decision and lists the alerts.
func (rs *retryStory) print(w io.Writer, now time.Time) {
	var pending []string
	for task, r := range rs.lastRetry {
		if !rs.publishedAt[task].Before(rs.retryAt[task]) {
			continue // published after its decision
		}
		pending = append(pending, task+": "+rs.why(r, now))
	}
	sort.Strings(pending)
	superseded := rs.decided - rs.sent - len(pending)
	fmt.Fprintf(w, "\nRetries: %d decided, %d published to the retry topic when due, %d superseded by the task's next event before they were due, %d pending:\n",
		rs.decided, rs.sent, max(0, superseded), len(pending))
	for _, p := range pending {
		fmt.Fprintln(w, "  "+p)
	}
	fmt.Fprintf(w, "\nAlerts (%d on the alerts topic):\n", len(rs.alerts))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tSCOPE\tKEY\tSTATE\tREASON")
	for _, a := range rs.alerts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Kind, a.Scope, a.Key, strings.Trim(string(a.From)+"->"+string(a.To), "->"), a.Reason)
	}
	tw.Flush()
}

// why a retry is still pending: a breaker it would be published into is
// open, or it is not due yet.
func (rs *retryStory) why(r *event.Routed, now time.Time) string {
	e := r.Event
	refs := []string{"PROVIDER_MODEL/" + e.Provider + "/" + e.Model, "DOWNSTREAM/" + e.Action, "PROMPT_TEMPLATE/" + e.PromptTemplate}
	for _, ref := range refs {
		b, ok := rs.breakers[ref]
		if !ok || b.To == breaker.Closed.Name() {
			continue
		}
		if rs.latched[ref] {
			scope, key, _ := strings.Cut(ref, "/")
			return fmt.Sprintf("held: breaker %s is %s until a person resets it (faultrouter breaker reset --scope %s --key %s --reason ...)", ref, b.To, scope, key)
		}
		return fmt.Sprintf("held: breaker %s is %s since %s; released when it half-opens", ref, b.To, b.At.Time.UTC().Format(time.TimeOnly))
	}
	if r.Decision.Retry != nil && r.Decision.Retry.NotBefore.After(now) {
		return "due at " + r.Decision.Retry.NotBefore.Time.UTC().Format(time.TimeOnly)
	}
	return "due; the router publishes it on its next tick"
}

// demoConsole serves the operator console on the demo's embedded broker
// until ctx ends, for a user "demo" with a one-time password.
func demoConsole(ctx context.Context, seeds []kgo.Opt, set topicspec.Set, listen string, stdout io.Writer, log *slog.Logger) error {
	b := make([]byte, 6)
	rand.Read(b)
	pw := hex.EncodeToString(b)
	hash, err := console.HashPassword(pw)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "faultrouter-demo-console-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	users := &console.Users{Users: []console.User{{Name: "demo", PasswordBcrypt: hash,
		Roles: []string{console.RoleReviewer, console.RoleOperator}, Owners: []string{"*"}}}}
	srv, err := console.New(console.Config{Listen: listen, StateDir: dir, Kafka: seeds, Topics: set, Users: users, Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("demo --console: %w", err)
	}
	fmt.Fprintf(stdout, "\nOperator console: http://%s  (user demo, password %s; Ctrl-C to stop)\n", ln.Addr(), pw)
	return ctxErr(ctx, srv.Run(ctx, ln))
}
