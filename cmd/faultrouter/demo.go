package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
	"github.com/faultrouter/faultrouter/pkg/worker"
)

const demoSynopsis = `usage: faultrouter demo [--verbose] [--whatif CANDIDATE.yaml] [--console [--listen 127.0.0.1:8080]] [--serve [--kafka-port 9092]]

Starts an embedded Kafka broker (franz-go kfake), the router on a temporary
state directory, and a scripted stream of worker events covering every
failure class; waits until every event is routed and every due retry is
published or accounted for, then prints a summary per class and route, the
records on each output topic, what became of each retry and the alerts,
then the cost table of the stream (faultrouter cost), and ends with the
policy advisor's proposal from the same stream (faultrouter policy advise):
one provider's timeouts never clear after the first retry. Needs no set-up.

--whatif then replays the demo's stream through a candidate policy file
against the default policy the demo ran with (faultrouter policy whatif) and
prints what it would have changed.

--console then opens the operator console on the same embedded broker, with
the review queue the demo filled, and runs until interrupted; it prints the
address and a one-time password for the user "demo".

--serve is --console with the embedded broker on 127.0.0.1:--kafka-port, so
that workers outside this process (docs/getting-started.md) report to it and
read its retries: it prints the FAULTROUTER_BROKERS to give them.`

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, _ := newFlagSet("demo", demoSynopsis, stderr)
	verbose := fs.Bool("verbose", false, "print the router's event log to stderr")
	withConsole := fs.Bool("console", false, "then open the operator console on the embedded broker until interrupted")
	listen := fs.String("listen", "127.0.0.1:8080", "with --console: the console's HTTP address")
	serve := fs.Bool("serve", false, "--console, with the embedded broker on 127.0.0.1:--kafka-port for workers outside this process")
	kafkaPort := fs.Int("kafka-port", 9092, "with --serve: the embedded broker's port on 127.0.0.1 (0 picks a free one)")
	whatifFile := fs.String("whatif", "", "then replay the stream through this candidate policy file and print what it would have changed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var candidate *policy.Policy
	if *whatifFile != "" {
		var err error
		if candidate, err = loadPolicy(*whatifFile); err != nil {
			return err
		}
	}
	began := time.Now().Add(-time.Second)
	runCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	kopts := []kfake.Opt{kfake.NumBrokers(1)}
	if *serve {
		*withConsole = true
		kopts = append(kopts, kfake.Ports(*kafkaPort))
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return fmt.Errorf("demo: embedded broker: %w", err)
	}
	defer cluster.Close()
	seeds := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}

	set, err := topicspec.Load("")
	if err != nil {
		return err
	}
	set = set.WithPartitions(3)
	admCl, err := kgo.NewClient(seeds...)
	if err != nil {
		return err
	}
	defer admCl.Close()
	if _, err := set.Apply(ctx, kadm.NewClient(admCl)); err != nil {
		return fmt.Errorf("demo: create topics: %w", err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		log, _ = logging.New(stderr, logging.FormatText, "info")
	}
	dir, err := os.MkdirTemp("", "faultrouter-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := router.Default()
	cfg.ClientOpts = seeds
	cfg.Topics = set.Topics()
	cfg.StateDir = dir
	cfg.InstanceID = "demo"
	cfg.Logger = log
	rt, err := router.New(cfg)
	if err != nil {
		return err
	}
	rctx, stopRouter := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- rt.Run(rctx) }()
	defer func() { stopRouter(); <-done }()

	c, err := codec.New()
	if err != nil {
		return err
	}
	// the workers report through pkg/worker, as a Go worker would
	rep, err := worker.NewReporter(worker.Config{ClientOpts: seeds})
	if err != nil {
		return err
	}
	defer rep.Close()
	script := demoScript(time.Now().Add(-time.Minute))
	script = append(script, demoAdviceScript(time.Now().Add(-time.Minute))...)
	events := make([]*event.TaskEvent, len(script))
	for i := range script {
		events[i] = &script[i]
	}
	// and one worker wrote a record with a broken serializer
	garbled := &kgo.Record{Topic: cfg.Topics.Ingress, Key: []byte("t-garbled"), Value: []byte("\x00\x01not avro")}
	pcl, err := kgo.NewClient(seeds...)
	if err != nil {
		return err
	}
	defer pcl.Close()
	inputs := len(events) + 1
	fmt.Fprintf(stdout, "faultrouter demo: embedded broker %v, %d worker events (%d tasks) on %s\n",
		cluster.ListenAddrs(), inputs, countTasks(script)+1, cfg.Topics.Ingress)
	if err := rep.Report(ctx, events...); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := pcl.ProduceSync(ctx, garbled).FirstErr(); err != nil {
		return fmt.Errorf("demo: produce: %w", err)
	}

	// read the outputs back until every input has its audit record and the
	// due retries are published
	counts := map[string]int{}
	rows := map[[2]string]int{}
	ccl, err := kgo.NewClient(append(seeds,
		kgo.ConsumeTopics(cfg.Topics.Audit, cfg.Topics.Retry, cfg.Topics.Review, cfg.Topics.DeadLetter, cfg.Topics.Alerts),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return err
	}
	defer ccl.Close()
	// a retry decided last for its task is published when due: wait past the
	// latest due time once every input has its audit record
	last := map[string]event.Decision{}
	rs := newRetryStory()
	for {
		var due time.Time
		for _, d := range last {
			if d.Route == event.RouteRetry && d.Retry != nil && d.Retry.NotBefore.After(due) {
				due = d.Retry.NotBefore.Time
			}
		}
		if counts[cfg.Topics.Audit] >= inputs && time.Now().After(due.Add(500*time.Millisecond)) {
			break
		}
		pctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		fetches := ccl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return errors.New("demo: the router did not route every event within 2 minutes")
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			counts[rec.Topic]++
			switch rec.Topic {
			case cfg.Topics.Alerts:
				if b, err := c.DecodeBreakerEvent(rec.Value); err == nil {
					rs.alert(b, codec.ParseBreakerHeaders(rec.Headers).Latched)
				}
				return
			case cfg.Topics.Retry:
				rs.published(string(rec.Key), rec.Timestamp)
				return
			case cfg.Topics.Audit:
			default:
				return
			}
			r, err := c.DecodeRouted(rec.Value)
			if err != nil {
				return
			}
			rows[[2]string{string(r.Decision.Class), string(r.Decision.Route)}]++
			if r.Event != nil {
				last[r.Event.TaskID] = r.Decision
				rs.audited(r, rec.Timestamp)
			}
		})
	}
	printSummary(stdout, rows, counts, cfg.Topics)
	rs.print(stdout, time.Now())
	if err := demoCost(ctx, seeds, cfg, began, candidate, stdout); err != nil {
		return err
	}
	if err := demoAdvise(ctx, seeds, cfg.Topics, began, stdout); err != nil {
		return err
	}
	if !*withConsole {
		return nil
	}
	if *serve {
		fmt.Fprintf(stdout, "\nWorkers outside this process: export FAULTROUTER_BROKERS=%s\n", strings.Join(cluster.ListenAddrs(), ","))
	}
	return demoConsole(runCtx, seeds, set, *listen, stdout, log)
}

func printSummary(w io.Writer, rows map[[2]string]int, counts map[string]int, t router.Topics) {
	keys := make([][2]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	fmt.Fprintln(w, "\nAudit records by class and route:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tROUTE\tEVENTS")
	total := 0
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", k[0], k[1], rows[k])
		total += rows[k]
	}
	fmt.Fprintf(tw, "TOTAL\t\t%d\n", total)
	tw.Flush()
	fmt.Fprintln(w, "\nRecords per output topic:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, topic := range []string{t.Retry, t.Review, t.DeadLetter, t.Audit, t.Alerts} {
		fmt.Fprintf(tw, "%s\t%d\n", topic, counts[topic])
	}
	tw.Flush()
}

func countTasks(evs []event.TaskEvent) int {
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.TaskID] = true
	}
	return len(seen)
}
