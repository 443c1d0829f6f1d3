package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// policyUsage is the synopsis of the policy verb.
const policyUsage = `usage: faultrouter policy check FILE
       faultrouter policy explain [--policy FILE] [--format text|json] < events.json
       faultrouter policy default
       faultrouter policy whatif --policy FILE [--baseline FILE] --since T [--until T] [--format table|json|csv]
       faultrouter policy advise --since T [--until T] [--policy FILE] [--out FILE] [--format table|json]`

// policyCommand runs `policy`:
//
//   - check FILE validates a policy file and prints "ok: FILE", or returns the
//     one error naming the file, line, field and what is allowed.
//   - explain reads TaskEvent JSON from stdin and prints, for each event, the
//     class, rule, route, reason, retry plan and review owner the policy
//     decides (--format json: one Decision object a line). Several events
//     (JSON lines or concatenated objects) are decided in order, each task
//     with its own history, so that history classes (a third timeout, a second
//     429, a params mismatch) can be explained too; an event_id seen before is
//     an exact redelivery (DROP). The router's clock is taken to be each
//     event's occurred_at, so the output is reproducible. Under a policy with
//     overrides each decision names the override that decided it.
//   - default prints the commented default policy, a starting point for a file.
func policyCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("policy: missing subcommand; %s", policyUsage)
	}
	switch args[0] {
	case "check":
		return policyCheck(args[1:], stdout)
	case "explain":
		return policyExplain(args[1:], stdin, stdout)
	case "default":
		if len(args) > 1 {
			return fmt.Errorf("policy default: unexpected argument %q; %s", args[1], policyUsage)
		}
		_, err := stdout.Write(policy.DefaultYAML())
		return err
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, policyUsage)
		return nil
	}
	return fmt.Errorf("policy: unknown subcommand %q (allowed: check, explain, default, whatif, advise); %s", args[0], policyUsage)
}

func policyCheck(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("policy check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, policyUsage)
		return nil
	} else if err != nil {
		return fmt.Errorf("policy check: %w; %s", err, policyUsage)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("policy check: want exactly one FILE, got %d arguments; %s", fs.NArg(), policyUsage)
	}
	file := fs.Arg(0)
	if _, err := loadPolicy(file); err != nil {
		return err
	}
	_, err := fmt.Fprintf(stdout, "ok: %s\n", file)
	return err
}

func policyExplain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("policy explain", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("policy", "", "policy file (default: the built-in default policy)")
	format := fs.String("format", "text", "output format: text or json")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, policyUsage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	} else if err != nil {
		return fmt.Errorf("policy explain: %w; %s", err, policyUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("policy explain: unexpected argument %q (the events come on stdin); %s", fs.Arg(0), policyUsage)
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("policy explain: --format must be text or json, got %q", *format)
	}
	p := policy.Default()
	if *file != "" {
		var err error
		if p, err = loadPolicy(*file); err != nil {
			return err
		}
	}
	events, err := readEvents(stdin)
	if err != nil {
		return err
	}

	states := make(map[string]*task.State)
	for i, ev := range events {
		st := states[ev.TaskID]
		if st == nil {
			st = new(task.State)
			states[ev.TaskID] = st
		}
		now := ev.OccurredAt.Time
		var d event.Decision
		if st.Seen(ev.EventID) {
			d = p.Drop(&ev, st, now)
		} else {
			d = p.Decide(&ev, st, now)
		}
		if *format == "json" {
			b, err := json.Marshal(d)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(stdout, "%s\n", b); err != nil {
				return err
			}
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := writeDecision(stdout, p, &ev, d); err != nil {
			return err
		}
	}
	return nil
}

// readEvents decodes every TaskEvent of r strictly; an error names the event
// by its position.
func readEvents(r io.Reader) ([]event.TaskEvent, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("policy explain: reading stdin: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var events []event.TaskEvent
	for n := 1; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("policy explain: event %d: invalid JSON: %w", n, err)
		}
		ev, err := event.ParseTaskEventJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("policy explain: event %d: %w", n, err)
		}
		events = append(events, ev)
	}
	if len(events) == 0 {
		return nil, errors.New("policy explain: no event on stdin; pipe one TaskEvent JSON object")
	}
	return events, nil
}

// writeDecision prints a decision as aligned "name: value" lines. Under a
// policy with overrides it names the override that decided (its match and
// the sections it changes), or says the base policy did.
func writeDecision(w io.Writer, p *policy.Policy, ev *event.TaskEvent, d event.Decision) error {
	line := func(name, value string) string { return fmt.Sprintf("%-17s%s\n", name+":", value) }
	var b strings.Builder
	b.WriteString(line("event", fmt.Sprintf("%s (task %s, attempt %d)", ev.EventID, ev.TaskID, ev.Attempt)))
	switch o, ok := p.OverrideFor(ev); {
	case d.Override != "" && ok && o.Name == d.Override:
		b.WriteString(line("override", fmt.Sprintf("%s (match %s; changes %s)", o.Name, o.Match, strings.Join(o.Sections(), ", "))))
	case d.Override != "":
		b.WriteString(line("override", d.Override))
	case len(p.Overrides) > 0 && d.Route != event.RouteDrop:
		b.WriteString(line("override", "none: no override matches provider "+orNone(ev.Provider)+", model "+orNone(ev.Model)+
			", action "+orNone(ev.Action)+", prompt template "+orNone(ev.PromptTemplate)+"; the base policy decided"))
	}
	b.WriteString(line("class", string(d.Class)))
	b.WriteString(line("rule", d.Rule))
	b.WriteString(line("route", string(d.Route)))
	b.WriteString(line("reason", d.Reason))
	retry := "none"
	if r := d.Retry; r != nil {
		retry = fmt.Sprintf("retry %d after %d ms, not before %s", r.N, r.DelayMs, r.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	b.WriteString(line("retry", retry))
	review := "none"
	if r := d.Review; r != nil {
		review = fmt.Sprintf("owner %s, priority %s, SLA %s", r.Owner, r.Priority, time.Duration(r.SLAMs)*time.Millisecond)
	}
	b.WriteString(line("review", review))
	if d.Feedback != "" {
		b.WriteString(line("feedback", d.Feedback))
	}
	if d.SuggestedModel != "" {
		b.WriteString(line("suggested model", d.SuggestedModel))
	}
	t := d.Totals
	b.WriteString(line("totals", fmt.Sprintf("attempts %d, retries %d, cost $%g, tokens %d, elapsed %d ms",
		t.Attempts, t.Retries, t.CostUSD, t.Tokens, t.ElapsedMs)))
	_, err := io.WriteString(w, b.String())
	return err
}

func orNone(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// loadPolicy reads and parses the policy file at path; an error names the
// file, and a field error its key and line.
func loadPolicy(path string) (*policy.Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return policy.ParseFile(path, b)
}
