package router

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// input is one consumed record, decoded (package decode), and what routing
// it decided.
type input struct {
	decode.Input
	decision event.Decision
	// state is the working state of the task the input was routed on
	// (route): a task event's or a review decision's, else nil
	state *task.State
	// started and finished tell that this event opened its task or brought
	// it to a terminal decision; taskMs is then the task's time to that
	// decision, on the events' clock.
	started, finished bool
	taskMs            int64
	// repeat says why a decided task event's usage is not counted (an
	// attempt already counted: a forward, a re-drive, a redelivery after the
	// TTL), "" when it is; prevented is the cost prevented its decision
	// claims (policy.Claim), nil for none. Both go on the audit record and
	// into the ledger's metrics (ledger.go).
	repeat    policy.Repeat
	prevented *event.Prevented
	// heldDue is the retry's own due time (router clock, ms) when its
	// decision held it at once behind an open breaker (Breakers.HoldAhead),
	// else 0: the decision line says so.
	heldDue int64
}

// decoder decodes the router's input records (package decode): the
// decisions topic's as review decisions and breaker commands, the others as
// task events; a misplaced one is forwarded (package forward), and one whose
// routed records the broker would refuse is dead-lettered (package refuse,
// on the limits of the session).
func (r *Router) decoder() *decode.Decoder {
	return decode.New(decode.Config{Codec: r.codec, MaxRecordBytes: r.cfg.MaxRecordBytes, Decisions: r.cfg.Topics.Decisions,
		Misplaced: r.fwd.Misplaced, Refused: func(in *decode.Input) { r.unw.Check(in, r.limits) }})
}

// decodeBatch takes the fetched records into the batch and decodes them
// into its inputs (package decode), in the single-object encoding: records
// in the Confluent wire format are rewritten first. While the schema
// registry does not answer, the batch waits for it, not ready meanwhile
// (faultrouter_registry_waiting), and nothing is dead-lettered for it.
// Nothing is produced while it waits: the batch's transaction has not
// begun. Once the registry answers, the batch carries an alert of scope
// REGISTRY that says how long routing waited.
func (r *Router) decodeBatch(ctx context.Context, fetches kgo.Fetches, b *batch) error {
	fetches.EachRecord(func(rec *kgo.Record) { b.recs = append(b.recs, rec) })
	if cap(b.inputs) > 4*max(len(b.recs), decode.ParallelMin) {
		b.inputs = nil // a backlog drain's batches were larger: let their inputs go
	}
	b.inputs = slices.Grow(b.inputs, len(b.recs))[:len(b.recs)]
	norm, waited, since, err := r.norm.All(ctx, b.recs, b.norm)
	if err != nil {
		return err
	}
	b.norm = norm
	if !since.IsZero() {
		r.brk.Alert(b, r.cfg.Now(), codec.AlertRegistry, registryAlert(r.cfg.Registry.URL(), waited, since)) // registry.go
	}
	r.dec.All(b.recs, b.norm, func(i int) *decode.Input { return &b.inputs[i].Input })
	r.metrics.consumed.Add(float64(len(b.inputs)))
	r.observeLag(fetches) // lag.go
	return nil
}

// logDecision writes the event line of one routed input, into the batch's
// lines (logging.Lines): countCommitted hands them to the log at once.
func (r *Router) logDecision(in *input) {
	d := &in.decision
	lvl := slog.LevelInfo
	if d.Route == event.RouteDeadLetter || d.Class == event.ClassInvalidInput {
		lvl = slog.LevelWarn
	}
	id := in.TaskID()
	if id == "" {
		id = string(in.Rec.Key)
	}
	l := r.lines
	if !l.Start(lvl, "routed", time.Now(), id) {
		return
	}
	l.Str("topic", in.Rec.Topic)
	l.Int("partition", int64(in.Rec.Partition))
	l.Int("offset", in.Rec.Offset)
	l.Str("class", string(d.Class))
	l.Str("route", string(d.Route))
	l.Str("rule", d.Rule)
	l.Str("reason", d.Reason)
	if d.Override != "" {
		l.Str("override", d.Override)
	}
	if in.heldDue != 0 {
		l.Str("held", "breaker open")
		l.Time("due", time.UnixMilli(in.heldDue))
	}
	l.End()
}
