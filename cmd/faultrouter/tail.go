package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const tailSynopsis = `usage: faultrouter tail --topic NAME [--from-beginning] [--until-end | --until-idle DUR] [--format json|text]

Prints the decoded records of a topic, committed ones only (read_committed):
one JSON object a line in the TaskEvent shape, plus "decision" and "input" on
routed and audit records; BreakerEvent fields on alerts. A record that does
not decode is printed as an error object with its offset, and tailing goes on.
NAME is a short name (ingress, decisions, retry, review, audit, deadletter,
alerts, state) or a full topic name.

--until-end prints what was committed when tail started and exits: it reads
every partition up to its last stable offset of that moment (kcat -e). Use
it in scripts; --until-idle instead waits for a quiet spell and can stop
early on a slow broker.`

func tailCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("tail", tailSynopsis, stderr)
	var (
		topic    = fs.String("topic", "", "topic to print (required)")
		fromBeg  = fs.Bool("from-beginning", false, "start at the earliest record instead of the end")
		idle     = fs.Duration("until-idle", 0, "exit once no record arrived for this long (e.g. 5s); 0 runs until interrupted")
		untilEnd = fs.Bool("until-end", false, "exit after the last record committed when tail started")
		format   = fs.String("format", "json", "output: json (one object a line) or text")
		maxCount = fs.Int("max", 0, "exit after this many records; 0 for no limit")
	)
	regFlags := addRegistryFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *topic == "" {
		return fmt.Errorf("tail: --topic is required")
	}
	if *format != "json" && *format != "text" {
		return fmt.Errorf("tail: --format %q: allowed json, text", *format)
	}
	if *untilEnd && *idle > 0 {
		return fmt.Errorf("tail: --until-end and --until-idle: allowed one of them")
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	name := *topic
	if n, err := set.Name(topicspec.Short(*topic)); err == nil {
		name = n
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if c, err = regFlags.reading(c); err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	if err := g.requireTopics(ctx, "tail", opts, name); err != nil {
		return err
	}
	p := &printer{c: c, w: stdout, text: *format == "text"}
	count := 0
	if *untilEnd {
		return tailToEnd(ctx, opts, name, *fromBeg, func(rec *kgo.Record) bool {
			p.print(rec)
			count++
			return *maxCount == 0 || count < *maxCount
		})
	}
	start := kgo.NewOffset().AtEnd()
	if *fromBeg {
		start = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumeTopics(name),
		kgo.ConsumeResetOffset(start),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if *idle > 0 {
			pctx, cancel = context.WithTimeout(ctx, *idle)
		}
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		n := 0
		var ferr error
		fetches.EachError(func(t string, part int32, err error) {
			if pctx.Err() == nil {
				ferr = fmt.Errorf("tail %s/%d: %w", t, part, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			if *maxCount > 0 && count >= *maxCount {
				return
			}
			p.print(rec)
			n++
			count++
		})
		if *maxCount > 0 && count >= *maxCount {
			return nil
		}
		if n == 0 && *idle > 0 && pctx.Err() != nil {
			return nil
		}
	}
}

// tailToEnd calls print with every record of topic committed now (none
// when tail starts at the end), in offset order within each partition,
// until print returns false.
func tailToEnd(ctx context.Context, opts []kgo.Opt, topic string, fromBeginning bool, print func(*kgo.Record) bool) error {
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	ranges, err := scan.Committed(ctx, kadm.NewClient(adm), topic)
	adm.Close()
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("tail: %w", err))
	}
	if !fromBeginning {
		return nil
	}
	err = scan.Read(ctx, opts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			if !print(rec) {
				return scan.Stop
			}
		}
		return nil
	})
	return ctxErr(ctx, err)
}

// printer writes one line per record.
type printer struct {
	c    *codec.Codec // reads the Confluent wire format too with --registry-url
	w    io.Writer
	text bool
}

// undecodable is the JSON form of a record that does not decode, or of a
// dead-lettered input record (original bytes plus the error headers).
type undecodable = replay.Raw

func (p *printer) print(rec *kgo.Record) {
	var (
		v   any
		err error
	)
	if e := codec.ParseHeaders(rec.Headers).Error; e.Raw() {
		v = replay.RawOf(rec, e)
	} else if v, err = p.c.Decode(rec.Value); err != nil {
		v = undecodable{
			Error: err.Error(), ErrorKind: codec.Kind(err),
			Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key),
			ValueBase64: base64.StdEncoding.EncodeToString(rec.Value),
		}
	}
	if p.text {
		fmt.Fprintln(p.w, textLine(rec, v))
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(undecodable{Error: err.Error(), ErrorKind: "json", Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset})
	}
	p.w.Write(append(b, '\n'))
}

func textLine(rec *kgo.Record, v any) string {
	at := fmt.Sprintf("%s %d@%d", rec.Topic, rec.Partition, rec.Offset)
	switch x := v.(type) {
	case *event.TaskEvent:
		return fmt.Sprintf("[TASK:%s] %s attempt=%d status=%s stage=%s event=%s", x.TaskID, at, x.Attempt, x.Status, x.Stage, x.EventID)
	case *event.Routed:
		id := string(rec.Key)
		if x.Event != nil {
			id = x.Event.TaskID
		}
		d := x.Decision
		retry := ""
		if d.Retry != nil {
			retry = fmt.Sprintf(" retry=%d not_before=%s", d.Retry.N, d.Retry.NotBefore.Format(time.RFC3339))
		}
		return fmt.Sprintf("[TASK:%s] %s %s -> %s (%s)%s: %s", id, at, d.Class, d.Route, d.Rule, retry, d.Reason)
	case *event.BreakerEvent:
		return fmt.Sprintf("[TASK:%s] %s %s %s %s %s->%s: %s", x.TaskID, at, x.Kind, x.Scope, x.Key, x.From, x.To, x.Reason)
	case *event.ReviewDecision:
		verdict := "reject"
		if x.Approve {
			verdict = "approve"
		}
		return fmt.Sprintf("[TASK:%s] %s review %s by %s: %s", x.TaskID, at, verdict, x.Reviewer, x.Reason)
	case undecodable:
		return fmt.Sprintf("[TASK:%s] %s ERROR %s: %s", x.Key, at, x.ErrorKind, x.Error)
	}
	return at
}
