package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const replaySynopsis = `usage: faultrouter replay --topic NAME [--since T] [--until T] [filters] [--format json|table]
       faultrouter replay --task ID --timeline [--since T] [--until T]
       faultrouter replay --topic deadletter|review [filters] --redrive-to ingress [--dry-run] [--max-redrives N] [--operator NAME] [--reason TEXT [--force]]

Incident analysis over committed records (read_committed).

A time range (--since, --until: RFC 3339 or relative like -2h) is located with
offsets-for-times: each partition is read from the first offset at or after
--since up to the first offset at or after --until, never scanned from the
beginning. Start and end offsets and progress go to stderr.

--timeline prints one task's whole story across ingress, decisions, audit,
retry, review, dead letter and alerts in time order, each step with its
decision and reason.

--redrive-to ingress re-produces the original events of the selected
dead-letter or review records (raw dead-lettered input as its original bytes)
with lineage headers faultrouter.redrive.source.{topic,partition,offset},
faultrouter.redrive.count, faultrouter.redrive.reason (--reason) and
faultrouter.redrive.operator (--operator, by default $USER), all in one
transaction: the same lineage the console writes for its signed-in person. The router takes a re-driven event as an operator's
instruction: it reopens the task (a fresh retry budget) and decides the event
afresh, and the audit record names the re-drive. --dry-run prints what would
be sent and sends nothing. A record
already re-driven --max-redrives times is refused by the loop guard. A write
whose outcome is unknown (class OUTCOME_UNKNOWN, or a WRITE operation
SUBMITTED or UNKNOWN) is refused unless --force and --reason are both given:
running it again may execute it twice.`

type replayFlags struct {
	topic, since, until, format, redriveTo string
	reason, operator                       string
	timeline, dryRun, force                bool
	maxRedrives, progressEvery             int
	progressInterval, idle                 time.Duration
	filter                                 replay.Filter
}

func replayCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("replay", replaySynopsis, stderr)
	var f replayFlags
	fs.StringVar(&f.topic, "topic", "", "topic to replay: short name or full name (required unless --timeline)")
	fs.StringVar(&f.since, "since", "", "first record time: RFC 3339 or relative like -2h (default: the earliest record)")
	fs.StringVar(&f.until, "until", "", "end of the range, exclusive: RFC 3339 or relative (default: the end at start-up)")
	fs.StringVar(&f.filter.Task, "task", "", "only this task ID")
	fs.StringVar(&f.filter.Class, "class", "", "only decisions of this class, e.g. NETWORK_TIMEOUT")
	fs.StringVar(&f.filter.Route, "route", "", "only decisions with this route, e.g. REVIEW")
	fs.StringVar(&f.filter.Rule, "rule", "", "only decisions of this rule, e.g. retry.held_expired (retries held behind a breaker past their task's lifetime)")
	fs.StringVar(&f.filter.Provider, "provider", "", "only events of this provider")
	fs.StringVar(&f.filter.Model, "model", "", "only events of this model")
	fs.StringVar(&f.filter.PromptTemplate, "prompt-template", "", "only events of this prompt template")
	fs.StringVar(&f.format, "format", "", "output: json (one object a line) or table; default json, table with --timeline")
	fs.BoolVar(&f.timeline, "timeline", false, "print the --task's story across every topic in time order")
	fs.StringVar(&f.redriveTo, "redrive-to", "", "re-produce the selected records' original events to this topic (only ingress)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "with --redrive-to: print what would be sent and send nothing")
	fs.BoolVar(&f.force, "force", false, "with --redrive-to and --reason: also re-drive writes whose outcome is unknown (OUTCOME_UNKNOWN; WRITE operations SUBMITTED or UNKNOWN)")
	fs.StringVar(&f.reason, "reason", "", "with --redrive-to: why, carried on the re-driven records (faultrouter.redrive.reason); required with --force")
	fs.StringVar(&f.operator, "operator", accountName(), "with --redrive-to: who re-drives, carried on the re-driven records (faultrouter.redrive.operator); default $USER, else the OS account")
	fs.IntVar(&f.maxRedrives, "max-redrives", 3, "loop guard: refuse records already re-driven this many times")
	fs.IntVar(&f.progressEvery, "progress-every", 10000, "report progress on stderr every N records read")
	fs.DurationVar(&f.progressInterval, "progress-interval", 5*time.Second, "report progress on stderr at least this often")
	fs.DurationVar(&f.idle, "idle", 30*time.Second, "give up on partitions that deliver nothing for this long (a broker in trouble); reading ends at the end offsets without waiting")
	regFlags := addRegistryFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	now := time.Now()
	var err error
	if f.filter.Since, err = optTime(f.since, now); err != nil {
		return fmt.Errorf("replay: --since: %w", err)
	}
	if f.filter.Until, err = optTime(f.until, now); err != nil {
		return fmt.Errorf("replay: --until: %w", err)
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	shortOf := map[string]topicspec.Short{}
	for _, s := range topicspec.Shorts() {
		if n, err := set.Name(s); err == nil {
			shortOf[n] = s
		}
	}
	var topics []string
	if f.timeline {
		for _, s := range replay.TimelineShorts {
			n, _ := set.Name(s)
			topics = append(topics, n)
		}
	} else {
		name := f.topic
		if n, err := set.Name(topicspec.Short(f.topic)); err == nil {
			name = n
		}
		topics = []string{name}
	}
	if f.redriveTo != "" {
		if s := shortOf[topics[0]]; s != topicspec.DeadLetter && s != topicspec.Review {
			return fmt.Errorf("replay: --redrive-to re-drives dead-letter or review records; --topic %s is neither", f.topic)
		}
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	if c, err = regFlags.reading(c); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "replay", opts, topics...); err != nil {
		return err
	}
	found, err := replay.Read(ctx, opts, c, topics, replay.ReadOptions{Filter: f.filter, ShortOf: shortOf, Idle: f.idle,
		Progress: stderr, ProgressEvery: f.progressEvery, ProgressInterval: f.progressInterval})
	if err != nil {
		return ctxErr(ctx, err)
	}
	if f.redriveTo != "" {
		target, err := set.Name(topicspec.Short(f.redriveTo))
		if err != nil {
			return err
		}
		return redrive(ctx, opts, c, found, target, &f, stdout, stderr)
	}
	steps := make([]replay.Step, len(found))
	for i := range found {
		steps[i] = found[i].Step
	}
	if f.timeline {
		replay.Timeline(steps)
	}
	if f.format == "table" {
		return printTable(stdout, steps)
	}
	for i := range steps {
		printStepJSON(stdout, &steps[i])
	}
	return nil
}

func (f *replayFlags) validate() error {
	switch {
	case f.timeline && f.filter.Task == "":
		return errors.New("replay: --timeline needs --task ID")
	case !f.timeline && f.topic == "":
		return errors.New("replay: --topic is required (or --task ID --timeline)")
	case f.redriveTo != "" && topicspec.Short(f.redriveTo) != topicspec.Ingress:
		return fmt.Errorf("replay: --redrive-to %q: allowed ingress", f.redriveTo)
	case f.redriveTo != "" && f.timeline:
		return errors.New("replay: --redrive-to and --timeline do not go together")
	case f.dryRun && f.redriveTo == "":
		return errors.New("replay: --dry-run goes with --redrive-to")
	case (f.force || f.reason != "") && f.redriveTo == "":
		return errors.New("replay: --force and --reason go with --redrive-to")
	case f.redriveTo != "" && strings.TrimSpace(f.operator) == "":
		return errors.New("replay: --redrive-to needs --operator NAME ($USER is empty and the OS account has no name): the re-driven records name who sent them")
	case f.force && strings.TrimSpace(f.reason) == "":
		return errors.New("replay: --force needs --reason TEXT: say why a write whose outcome is unknown may run again")
	case f.maxRedrives < 1:
		return fmt.Errorf("replay: --max-redrives %d: at least 1", f.maxRedrives)
	}
	if f.format == "" {
		f.format = "json"
		if f.timeline {
			f.format = "table"
		}
	}
	if f.format != "json" && f.format != "table" {
		return fmt.Errorf("replay: --format %q: allowed json, table", f.format)
	}
	return nil
}

// accountName is $USER, else the name of the process's OS account, else "".
func accountName() string {
	if n := strings.TrimSpace(os.Getenv("USER")); n != "" {
		return n
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

func optTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return replay.ParseTime(s, now)
}

// printStepJSON writes the record as tail does, plus "record": where it is.
func printStepJSON(w io.Writer, st *replay.Step) {
	b, err := json.Marshal(st.Value)
	m := map[string]any{}
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		m = map[string]any{"error": err.Error(), "error_kind": "json"}
	}
	meta := map[string]any{"topic": st.Topic, "partition": st.Partition, "offset": st.Offset,
		"timestamp": st.Timestamp.UTC().Format(time.RFC3339Nano), "kind": st.Kind}
	if len(st.Lineage) > 0 {
		meta["redrive"] = st.Lineage
	}
	m["record"] = meta
	b, _ = json.Marshal(m)
	w.Write(append(b, '\n'))
}

func printTable(w io.Writer, steps []replay.Step) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTOPIC\tAT\tTASK\tSTEP\tREASON")
	for _, s := range steps {
		short := string(s.Short)
		if short == "" {
			short = s.Topic
		}
		fmt.Fprintf(tw, "%s\t%s\t%d@%d\t%s\t%s\t%s\n", s.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"), short, s.Partition, s.Offset,
			s.TaskID, s.Summary, strings.ReplaceAll(s.Reason, "\n", " "))
	}
	return tw.Flush()
}

// redrive re-produces the original events of the found records to target in
// one transaction, or prints them on a dry run.
func redrive(ctx context.Context, opts []kgo.Opt, c *codec.Codec, recs []replay.Found, target string, f *replayFlags, stdout, stderr io.Writer) error {
	plan, err := control.PlanRedrive(c, recs, target, control.RedriveOptions{MaxRedrives: f.maxRedrives, Reason: f.reason, Force: f.force,
		Operator: strings.TrimSpace(f.operator)})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	refused, refusedUnknown := 0, 0
	for i := range plan {
		r := &plan[i]
		switch {
		case r.Refused != nil:
			fmt.Fprintf(stderr, "replay: %s task %s: %v\n", r.At(), r.Step.TaskID, r.Refused)
			if errors.Is(r.Refused, replay.ErrUnknownOutcome) {
				refusedUnknown++
			} else {
				refused++
			}
			continue
		case r.Out == nil:
			fmt.Fprintf(stderr, "replay: %s: skipped: %s\n", r.At(), r.Skipped)
			continue
		}
		rec := r.Source
		line := map[string]any{"dry_run": f.dryRun, "topic": target, "key": string(rec.Key), "redrive_count": r.Count,
			"source": map[string]any{"topic": rec.Topic, "partition": rec.Partition, "offset": rec.Offset}, "operator": strings.TrimSpace(f.operator)}
		if f.reason != "" {
			line["reason"] = f.reason
		}
		if r.Step.Kind == replay.KindPoison {
			line["value_base64"] = base64.StdEncoding.EncodeToString(r.Out.Value)
		} else {
			line["event"] = r.Step.Event
		}
		b, _ := json.Marshal(line)
		stdout.Write(append(b, '\n'))
	}
	out := control.Sendable(plan)
	if refused > 0 {
		fmt.Fprintf(stderr, "replay: loop guard refused %d record(s) already re-driven %d times\n", refused, f.maxRedrives)
	}
	if refusedUnknown > 0 {
		fmt.Fprintf(stderr, "replay: refused %d write(s) whose outcome is unknown; check the downstream system, then re-drive with --force --reason TEXT\n", refusedUnknown)
	}
	if f.dryRun {
		fmt.Fprintf(stderr, "replay: dry run: would re-drive %d record(s) to %s; nothing sent\n", len(out), target)
		return nil
	}
	if len(out) == 0 {
		fmt.Fprintf(stderr, "replay: nothing to re-drive\n")
		return nil
	}
	if err := control.ProduceTx(ctx, opts, out); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replay: re-drove %d record(s) to %s in one transaction\n", len(out), target)
	return nil
}
