package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/replay"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const replaySynopsis = `usage: faultrouter replay --topic NAME [--since T] [--until T] [filters] [--format json|table]
       faultrouter replay --task ID --timeline [--since T] [--until T]
       faultrouter replay --topic deadletter|review [filters] --redrive-to ingress [--dry-run] [--max-redrives N]

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
with lineage headers faultrouter.redrive.source.{topic,partition,offset} and
faultrouter.redrive.count, all in one transaction. --dry-run prints what would
be sent and sends nothing. A record already re-driven --max-redrives times is
refused by the loop guard.`

// timelineShorts are the topics of a task's story, in data-path order.
var timelineShorts = []string{"ingress", "decisions", "audit", "retry", "review", "deadletter", "alerts"}

type replayFlags struct {
	topic, since, until, format, redriveTo string
	timeline, dryRun                       bool
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
	fs.StringVar(&f.filter.Provider, "provider", "", "only events of this provider")
	fs.StringVar(&f.filter.Model, "model", "", "only events of this model")
	fs.StringVar(&f.filter.PromptTemplate, "prompt-template", "", "only events of this prompt template")
	fs.StringVar(&f.format, "format", "", "output: json (one object a line) or table; default json, table with --timeline")
	fs.BoolVar(&f.timeline, "timeline", false, "print the --task's story across every topic in time order")
	fs.StringVar(&f.redriveTo, "redrive-to", "", "re-produce the selected records' original events to this topic (only ingress)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "with --redrive-to: print what would be sent and send nothing")
	fs.IntVar(&f.maxRedrives, "max-redrives", 3, "loop guard: refuse records already re-driven this many times")
	fs.IntVar(&f.progressEvery, "progress-every", 10000, "report progress on stderr every N records read")
	fs.DurationVar(&f.progressInterval, "progress-interval", 5*time.Second, "report progress on stderr at least this often")
	fs.DurationVar(&f.idle, "idle", 30*time.Second, "give up on partitions that deliver nothing for this long (a broker in trouble); reading ends at the end offsets without waiting")
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
	shortOf := map[string]string{}
	for _, s := range topicspec.Shorts() {
		if n, err := set.Name(s); err == nil {
			shortOf[n] = s
		}
	}
	var topics []string
	if f.timeline {
		for _, s := range timelineShorts {
			n, _ := set.Name(s)
			topics = append(topics, n)
		}
	} else {
		name := f.topic
		if n, err := set.Name(f.topic); err == nil {
			name = n
		}
		topics = []string{name}
	}
	if f.redriveTo != "" {
		if s := shortOf[topics[0]]; s != "deadletter" && s != "review" {
			return fmt.Errorf("replay: --redrive-to re-drives dead-letter or review records; --topic %s is neither", f.topic)
		}
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	found, err := readRange(ctx, opts, c, topics, shortOf, &f, stderr)
	if err != nil {
		return ctxErr(ctx, err)
	}
	if f.redriveTo != "" {
		target, err := set.Name(f.redriveTo)
		if err != nil {
			return err
		}
		return redrive(ctx, opts, c, found, target, &f, stdout, stderr)
	}
	steps := make([]replay.Step, len(found))
	for i := range found {
		steps[i] = found[i].step
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
	case f.redriveTo != "" && f.redriveTo != "ingress":
		return fmt.Errorf("replay: --redrive-to %q: allowed ingress", f.redriveTo)
	case f.redriveTo != "" && f.timeline:
		return errors.New("replay: --redrive-to and --timeline do not go together")
	case f.dryRun && f.redriveTo == "":
		return errors.New("replay: --dry-run goes with --redrive-to")
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

func optTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return replay.ParseTime(s, now)
}

// found is a selected record and its step.
type found struct {
	rec  *kgo.Record
	step replay.Step
}

// partRange is the offsets [start, end) of one partition to read.
type partRange struct {
	start, end int64
}

// readRange reads every partition of topics over the time range of f and
// returns the records that pass the filters, in read order.
func readRange(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topics []string, shortOf map[string]string, f *replayFlags, stderr io.Writer) ([]found, error) {
	ranges, err := locate(ctx, opts, topics, f.filter.Since, f.filter.Until)
	if err != nil {
		return nil, err
	}
	consume := map[string]map[int32]kgo.Offset{}
	pending := 0
	for _, t := range sortedKeys(ranges) {
		for _, p := range sortedKeys(ranges[t]) {
			r := ranges[t][p]
			fmt.Fprintf(stderr, "replay: %s/%d: start offset %d, end offset %d (%d to read)\n", t, p, r.start, r.end, max(0, r.end-r.start))
			if r.end <= r.start {
				continue
			}
			if consume[t] == nil {
				consume[t] = map[int32]kgo.Offset{}
			}
			consume[t][p] = kgo.NewOffset().At(r.start)
			pending++
		}
	}
	var out []found
	read := 0
	if pending > 0 {
		cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(consume), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			// a transaction ends in a control record: seeing it tells a
			// partition reached an end offset that no data record reaches
			kgo.KeepControlRecords())...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		done := map[string]map[int32]bool{}
		isDone := func(t string, p int32) bool { return done[t][p] }
		markDone := func(t string, p int32) {
			if done[t] == nil {
				done[t] = map[int32]bool{}
			}
			if !done[t][p] {
				done[t][p] = true
				pending--
			}
		}
		lastReport := time.Now()
		for pending > 0 {
			pctx, cancel := context.WithTimeout(ctx, f.idle)
			fetches := cl.PollFetches(pctx)
			cancel()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var ferr error
			fetches.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					ferr = fmt.Errorf("replay %s/%d: %w", t, p, err)
				}
			})
			if ferr != nil {
				return nil, ferr
			}
			if fetches.NumRecords() == 0 && pctx.Err() != nil {
				// Nothing for f.idle below the end offsets: say so, and
				// print what was read.
				for t, ps := range consume {
					for p := range ps {
						if !isDone(t, p) {
							fmt.Fprintf(stderr, "replay: %s/%d: nothing more after %s idle; stopping the partition\n", t, p, f.idle)
							markDone(t, p)
						}
					}
				}
				break
			}
			fetches.EachRecord(func(rec *kgo.Record) {
				r := ranges[rec.Topic][rec.Partition]
				if isDone(rec.Topic, rec.Partition) || rec.Offset >= r.end {
					markDone(rec.Topic, rec.Partition)
					return
				}
				if rec.Attrs.IsControl() {
					if rec.Offset >= r.end-1 {
						markDone(rec.Topic, rec.Partition)
					}
					return
				}
				read++
				st := toStep(c, rec, shortOf[rec.Topic])
				if f.filter.Match(&st) {
					out = append(out, found{rec: rec, step: st})
				}
				if rec.Offset >= r.end-1 {
					markDone(rec.Topic, rec.Partition)
				}
				if (f.progressEvery > 0 && read%f.progressEvery == 0) || time.Since(lastReport) >= f.progressInterval {
					fmt.Fprintf(stderr, "replay: progress: %d records read, %d matched\n", read, len(out))
					lastReport = time.Now()
				}
			})
		}
	}
	fmt.Fprintf(stderr, "replay: %d records read, %d matched\n", read, len(out))
	return out, nil
}

// locate finds each partition's offsets for the time range: the first offset
// at or after since (the log start without since) up to the first offset at
// or after until, capped by the last stable offset (read_committed).
func locate(ctx context.Context, opts []kgo.Opt, topics []string, since, until time.Time) (map[string]map[int32]partRange, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var starts kadm.ListedOffsets
	if since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, topics...)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: listing start offsets: %w", err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("replay: listing end offsets: %w", err)
	}
	var untils kadm.ListedOffsets
	if !until.IsZero() {
		if untils, err = adm.ListOffsetsAfterMilli(ctx, until.UnixMilli(), topics...); err != nil {
			return nil, fmt.Errorf("replay: listing until offsets: %w", err)
		}
	}
	if err := starts.Error(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	out := map[string]map[int32]partRange{}
	ends.Each(func(e kadm.ListedOffset) {
		r := partRange{start: 0, end: e.Offset}
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Offset >= 0 {
			r.start = s.Offset
		} else {
			r.start = e.Offset // nothing at or after since
		}
		if u, ok := untils.Lookup(e.Topic, e.Partition); ok && u.Err == nil && u.Offset >= 0 && u.Offset < r.end {
			r.end = u.Offset
		}
		if out[e.Topic] == nil {
			out[e.Topic] = map[int32]partRange{}
		}
		out[e.Topic][e.Partition] = r
	})
	for _, t := range topics {
		if out[t] == nil {
			return nil, fmt.Errorf("replay: topic %s not found", t)
		}
	}
	return out, nil
}

func sortedKeys[K string | int32, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// toStep decodes one record into a replay step.
func toStep(c *codec.Codec, rec *kgo.Record, short string) replay.Step {
	st := replay.Step{Topic: rec.Topic, Short: short, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp, TaskID: string(rec.Key)}
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, replay.HeaderPrefix) {
			if st.Lineage == nil {
				st.Lineage = map[string]string{}
			}
			st.Lineage[strings.TrimPrefix(h.Key, replay.HeaderPrefix)] = string(h.Value)
		}
	}
	if hdr := errorHeaders(rec); hdr["faultrouter.error.stage"] != "" && hdr["faultrouter.error.stage"] != "route" {
		st.Kind = replay.KindPoison
		st.Summary = "dead-lettered input (" + hdr["faultrouter.error.stage"] + ")"
		st.Reason = hdr["faultrouter.error.kind"] + ": " + hdr["faultrouter.error.message"]
		st.Value = undecodable{
			Error: hdr["faultrouter.error.message"], ErrorKind: hdr["faultrouter.error.kind"],
			Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key),
			Headers: hdr, ValueBase64: base64.StdEncoding.EncodeToString(rec.Value),
		}
		return st
	}
	v, err := c.Decode(rec.Value)
	if err != nil {
		st.Kind, st.Summary, st.Reason = replay.KindUnusable, "undecodable record", err.Error()
		st.Value = undecodable{Error: err.Error(), ErrorKind: codec.Kind(err), Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
			Key: string(rec.Key), ValueBase64: base64.StdEncoding.EncodeToString(rec.Value)}
		return st
	}
	st.Value = v
	switch x := v.(type) {
	case *event.TaskEvent:
		st.Kind, st.Event, st.TaskID = replay.KindEvent, x, x.TaskID
		st.Summary = fmt.Sprintf("attempt %d %s", x.Attempt, x.Status)
		if x.Error != nil {
			st.Reason = strings.TrimSpace(fmt.Sprintf("%s %d %s %s", x.Error.Type, x.Error.HTTPStatus, x.Error.Code, x.Error.Message))
		}
		if n := replay.RedriveCount(headersOf(rec)); n > 0 {
			st.Summary += fmt.Sprintf(" (re-drive %d)", n)
		}
	case *event.Routed:
		st.Kind, st.Event, st.Decision = replay.KindRouted, x.Event, &x.Decision
		if x.Event != nil {
			st.TaskID = x.Event.TaskID
			st.Summary = fmt.Sprintf("attempt %d ", x.Event.Attempt)
		}
		st.Summary += fmt.Sprintf("%s -> %s", x.Decision.Class, x.Decision.Route)
		if x.Decision.Retry != nil {
			st.Summary += fmt.Sprintf(" (retry %d, not before %s)", x.Decision.Retry.N, x.Decision.Retry.NotBefore.Format(time.RFC3339))
		}
		st.Reason = x.Decision.Reason
	case *event.BreakerEvent:
		st.Kind, st.TaskID = replay.KindBreaker, x.TaskID
		st.Summary = strings.TrimSpace(fmt.Sprintf("%s %s %s %s", x.Kind, x.Scope, x.Key, strings.Trim(x.From+"->"+x.To, "->")))
		st.Reason = x.Reason
	case *event.ReviewDecision:
		st.Kind, st.TaskID = replay.KindReview, x.TaskID
		st.Summary = "review reject by " + x.Reviewer
		if x.Approve {
			st.Summary = "review approve by " + x.Reviewer
		}
		st.Reason = x.Reason
	}
	return st
}

func headersOf(rec *kgo.Record) []replay.Header {
	hs := make([]replay.Header, len(rec.Headers))
	for i, h := range rec.Headers {
		hs[i] = replay.Header{Key: h.Key, Value: h.Value}
	}
	return hs
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
		short := s.Short
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
func redrive(ctx context.Context, opts []kgo.Opt, c *codec.Codec, recs []found, target string, f *replayFlags, stdout, stderr io.Writer) error {
	var out []*kgo.Record
	refused := 0
	for _, fd := range recs {
		rec, st := fd.rec, &fd.step
		at := fmt.Sprintf("%s/%d@%d", rec.Topic, rec.Partition, rec.Offset)
		count := replay.RedriveCount(headersOf(rec))
		if err := replay.Guard(count, f.maxRedrives); err != nil {
			fmt.Fprintf(stderr, "replay: %s task %s: %v\n", at, st.TaskID, err)
			refused++
			continue
		}
		var value []byte
		switch st.Kind {
		case replay.KindPoison:
			value = rec.Value
		case replay.KindRouted:
			if st.Event == nil {
				fmt.Fprintf(stderr, "replay: %s: skipped: the routed record carries no event to re-drive\n", at)
				continue
			}
			v, err := c.EncodeTaskEvent(nil, st.Event)
			if err != nil {
				return fmt.Errorf("replay: %s: re-encoding task %s: %w", at, st.TaskID, err)
			}
			value = v
		default:
			fmt.Fprintf(stderr, "replay: %s: skipped: a %s record is not a dead letter or review item\n", at, st.Kind)
			continue
		}
		var keep []replay.Header
		for _, h := range headersOf(rec) {
			if st.Kind == replay.KindPoison || h.Key == "traceparent" {
				keep = append(keep, h)
			}
		}
		nr := &kgo.Record{Topic: target, Key: rec.Key, Value: value}
		for _, h := range replay.Lineage(keep, rec.Topic, rec.Partition, rec.Offset, count+1) {
			nr.Headers = append(nr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		out = append(out, nr)
		line := map[string]any{"dry_run": f.dryRun, "topic": target, "key": string(rec.Key), "redrive_count": count + 1,
			"source": map[string]any{"topic": rec.Topic, "partition": rec.Partition, "offset": rec.Offset}}
		if st.Kind == replay.KindPoison {
			line["value_base64"] = base64.StdEncoding.EncodeToString(value)
		} else {
			line["event"] = st.Event
		}
		b, _ := json.Marshal(line)
		stdout.Write(append(b, '\n'))
	}
	if refused > 0 {
		fmt.Fprintf(stderr, "replay: loop guard refused %d record(s) already re-driven %d times\n", refused, f.maxRedrives)
	}
	if f.dryRun {
		fmt.Fprintf(stderr, "replay: dry run: would re-drive %d record(s) to %s; nothing sent\n", len(out), target)
		return nil
	}
	if len(out) == 0 {
		fmt.Fprintf(stderr, "replay: nothing to re-drive\n")
		return nil
	}
	if err := produceTx(ctx, opts, out); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replay: re-drove %d record(s) to %s in one transaction\n", len(out), target)
	return nil
}

// produceTx produces recs in one transaction: all of them or none.
func produceTx(ctx context.Context, opts []kgo.Opt, recs []*kgo.Record) error {
	host, _ := os.Hostname()
	txID := fmt.Sprintf("faultrouter-replay-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(txID), kgo.RecordDeliveryTimeout(30*time.Second))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("replay: begin transaction: %w", err)
	}
	perr := cl.ProduceSync(ctx, recs...).FirstErr()
	commit := kgo.TransactionEndTry(perr == nil)
	if err := cl.EndTransaction(context.WithoutCancel(ctx), commit); err != nil {
		return fmt.Errorf("replay: end transaction: %w (nothing was re-driven)", err)
	}
	if perr != nil {
		return fmt.Errorf("replay: produce: %w; transaction aborted, nothing was re-driven", perr)
	}
	return nil
}
