package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/gcpace"
	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// runningRouter is a router built with router.New, as `faultrouter run`
// builds it, running in this process.
type runningRouter struct {
	rt       *router.Router
	reg      *prometheus.Registry
	cancel   context.CancelFunc
	done     chan error
	closeLog func() // writes the log's queued lines and waits for its file's writer
}

// startRouter builds a router with the default policy on topics and a state
// directory, starts it and waits until it is ready (state restored, partitions
// assigned). It returns the time from Run to ready. tune, when not nil,
// adjusts the router's config (the bench's --max-batch-* flags).
func startRouter(ctx context.Context, seeds []kgo.Opt, topics router.Topics, group, stateDir string, tune func(*router.Config)) (*runningRouter, time.Duration, error) {
	return startInstance(ctx, seeds, topics, group, "bench", stateDir, tune)
}

// startInstance is startRouter for an instance of its own name (its
// transactional ID is the group's name and the instance's).
func startInstance(ctx context.Context, seeds []kgo.Opt, topics router.Topics, group, instance, stateDir string, tune func(*router.Config)) (*runningRouter, time.Duration, error) {
	reg := prometheus.NewRegistry()
	cfg := router.Default()
	if tune != nil {
		tune(&cfg)
	}
	cfg.ClientOpts = seeds
	cfg.Topics = topics
	cfg.StateDir = stateDir
	cfg.Group = group
	cfg.InstanceID = instance
	// it logs as `faultrouter run` does by default (a line per decision,
	// text, info, to stderr): to a pipe, which another process (cat, where
	// a container's runtime would be) writes to a file beside its state
	// directory. The file's writes are not the router's CPU, as a
	// container's log file is not the container's, and a disk busy with
	// the broker's writes does not add its stalls to the router's time.
	f, err := os.Create(filepath.Clean(stateDir) + ".log")
	if err != nil {
		return nil, 0, err
	}
	defer f.Close() // cat has its own descriptor
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	sink := exec.Command("cat")
	sink.Stdin, sink.Stdout, sink.Stderr = pr, f, os.Stderr
	err = sink.Start()
	pr.Close() // cat has its own descriptor
	if err != nil {
		pw.Close()
		return nil, 0, fmt.Errorf("the router's log: %w", err)
	}
	log, closeLog, err := logging.NewAsync(pw, logging.FormatText, "info")
	if err != nil {
		pw.Close()
		sink.Wait()
		return nil, 0, err
	}
	closeFile := func() { closeLog(); pw.Close(); sink.Wait() }
	cfg.Logger = log
	cfg.Registerer = reg
	rt, err := router.New(cfg)
	if err != nil {
		closeFile()
		return nil, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	// the garbage collector paced as `faultrouter run` paces it (its
	// default --heap-budget-mib); one pacing for the routers of the process
	stopPace := gcpace.Tune(gcpace.DefaultBudget)
	r := &runningRouter{rt: rt, reg: reg, cancel: cancel, done: make(chan error, 1),
		closeLog: func() { stopPace(); closeFile() }}
	start := time.Now()
	go func() { r.done <- rt.Run(rctx) }()
	for !rt.Ready() {
		select {
		case err := <-r.done:
			cancel()
			r.closeLog()
			return nil, 0, fmt.Errorf("router stopped before it was ready: %v", err)
		case <-ctx.Done():
			r.stop()
			return nil, 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return r, time.Since(start), nil
}

func (r *runningRouter) stop() error {
	r.cancel()
	err := <-r.done
	r.closeLog()
	return err
}

// counter sums every sample of a counter, gauge or histogram family (all
// label values; a histogram's sum).
func (r *runningRouter) counter(name string) float64 {
	fams, err := r.reg.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				n += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				n += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				n += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return n
}

// observations is the sample count of a histogram family (all label
// values).
func (r *runningRouter) observations(name string) uint64 {
	fams, err := r.reg.Gather()
	if err != nil {
		return 0
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// routedByClass returns the routed counts by class.
func (r *runningRouter) routedByClass() map[string]int {
	out := map[string]int{}
	fams, _ := r.reg.Gather()
	for _, f := range fams {
		if f.GetName() != "faultrouter_routed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// waitRouted waits until the router has committed the routing of n input
// records and returns how long that took from now.
//
// Each look gathers the router's whole registry, in the router's process
// and so in its CPU: it looks again after half the time the rate so far
// says the rest takes (50 ms to 500 ms), not every 50 ms.
func (r *runningRouter) waitRouted(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	for {
		routed := r.counter("faultrouter_routed_total")
		if routed >= float64(n) {
			return time.Since(start), nil
		}
		wait := 50 * time.Millisecond
		if el := time.Since(start); routed > 0 {
			left := time.Duration((float64(n) - routed) / routed * float64(el))
			wait = min(max(wait, left/2), 500*time.Millisecond)
		}
		select {
		case err := <-r.done:
			return 0, fmt.Errorf("router stopped: %v", err)
		case <-ctx.Done():
			return 0, fmt.Errorf("routed %v of %d: %w", r.counter("faultrouter_routed_total"), n, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// waitCaughtUp waits until the router's consumer lag is zero.
func (r *runningRouter) waitCaughtUp(ctx context.Context) error {
	for r.counter("faultrouter_consumer_lag_records") > 0 {
		select {
		case err := <-r.done:
			return fmt.Errorf("router stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// routerTopics are the router's topics in a benchmark: those of the set but
// the breakers topic, which the benchmark's topics leave out (each router's
// breakers are its own).
func routerTopics(set topicspec.Set) router.Topics {
	t := set.Topics()
	t.Breakers = ""
	return t
}

// latency produces events at a steady rate for d and measures, for each, the
// time from its input record's timestamp to when its audit record is
// committed and read by a read_committed consumer. The first second is
// warm-up and not counted.
func latency(ctx context.Context, seeds []kgo.Opt, w *workload, audit string, firstTask int, rate float64, d time.Duration) (percentiles, error) {
	return observedLatency(ctx, seeds, w, audit, firstTask, rate, d, nil)
}

// observedLatency is latency that also calls observe, when not nil, for
// every event whose audit record was read (the warm-up's too): when its
// input was produced, when its audit record was read and its partition
// (the audit topic is keyed by task as ingress is, so it is the input's).
func observedLatency(ctx context.Context, seeds []kgo.Opt, w *workload, audit string, firstTask int, rate float64, d time.Duration,
	observe func(sent, read time.Time, partition int32)) (percentiles, error) {
	adm, err := kgo.NewClient(seeds...)
	if err != nil {
		return percentiles{}, err
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, audit)
	if err != nil {
		return percentiles{}, err
	}
	start := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) { start[o.Partition] = kgo.NewOffset().At(o.Offset) })
	opts := append([]kgo.Opt{}, seeds...)
	opts = append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{audit: start}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(time.Second),
	)
	rd, err := kgo.NewClient(opts...)
	if err != nil {
		return percentiles{}, err
	}
	defer rd.Close()
	prod, err := kgo.NewClient(append(append([]kgo.Opt{}, seeds...), kgo.ProducerLinger(0))...)
	if err != nil {
		return percentiles{}, err
	}
	defer prod.Close()

	// every event is the first attempt of a fresh task, so an audit record's
	// key names the input it came from: no decoding on the reading side,
	// whose CPU the router would otherwise share
	total := int(rate * d.Seconds())
	// the events are built and encoded before the run, in one buffer the
	// garbage collector does not scan, so that building them does not take
	// CPU from the router while it is measured, as the backlog run's events
	// were produced before it (their occurred_at is when they were built, a
	// few seconds before they are produced: a fresh task's first attempt is
	// decided the same either way)
	var (
		arena  []byte
		bounds = make([]int, 0, 2*total) // per event, the end of its key and of its value in arena
	)
	for i := range total {
		rec, err := w.record(firstTask+i, 1, time.Now())
		if err != nil {
			return percentiles{}, err
		}
		if arena == nil { // room for all, by the first one's size (the events differ by a few bytes)
			arena = make([]byte, 0, total*(len(rec.Key)+len(rec.Value))*5/4)
		}
		arena = append(arena, rec.Key...)
		bounds = append(bounds, len(arena))
		arena = append(arena, rec.Value...)
		bounds = append(bounds, len(arena))
	}
	var sentMu sync.Mutex
	sent := make(map[string]time.Time, total)
	t0 := time.Now()
	warm := t0.Add(time.Second)
	var (
		mu   sync.Mutex
		lats []time.Duration
		seen int
	)
	readDone := make(chan error, 1)
	rctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	go func() {
		for seen < total {
			fs := rd.PollFetches(rctx)
			if rctx.Err() != nil {
				if ctx.Err() != nil {
					readDone <- fmt.Errorf("latency: read %d of %d audit records: %w", seen, total, ctx.Err())
				} else {
					readDone <- errBehind // the router fell behind: report what was read
				}
				return
			}
			now := time.Now()
			fs.EachRecord(func(rec *kgo.Record) {
				sentMu.Lock()
				in, ok := sent[string(rec.Key)]
				delete(sent, string(rec.Key))
				sentMu.Unlock()
				if !ok {
					return // a retry's audit record, or not of this run
				}
				mu.Lock()
				seen++
				if in.After(warm) {
					lats = append(lats, now.Sub(in))
				}
				if observe != nil {
					observe(in, now, rec.Partition)
				}
				mu.Unlock()
			})
		}
		readDone <- nil
	}()

	// one task per event keeps every event a first attempt of a fresh task
	var produced int
	var perr error
	var pmu sync.Mutex
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for produced < total {
		<-tick.C
		due := min(total, int(rate*time.Since(t0).Seconds()))
		for ; produced < due; produced++ {
			from := 0
			if produced > 0 {
				from = bounds[2*produced-1]
			}
			k, v := bounds[2*produced], bounds[2*produced+1]
			rec := &kgo.Record{Topic: w.topic, Key: arena[from:k:k], Value: arena[k:v:v]}
			rec.Timestamp = time.Now()
			sentMu.Lock()
			sent[string(rec.Key)] = rec.Timestamp.Truncate(time.Millisecond) // the record carries ms
			sentMu.Unlock()
			prod.Produce(ctx, rec, func(_ *kgo.Record, err error) {
				if err != nil {
					pmu.Lock()
					perr = err
					pmu.Unlock()
				}
			})
		}
	}
	if err := prod.Flush(ctx); err != nil {
		return percentiles{}, err
	}
	if perr != nil {
		return percentiles{}, perr
	}
	readErr := <-readDone
	if readErr != nil && readErr != errBehind {
		return percentiles{}, readErr
	}
	mu.Lock()
	defer mu.Unlock()
	p := percentilesOf(lats)
	p.Missing = total - seen
	return p, nil
}

// errBehind says that not every audit record was read within 30 s of the
// end of a latency run: the router fell behind the rate.
var errBehind = errors.New("latency: the router fell behind")

type percentiles struct {
	// Missing counts the events whose audit record was not read within
	// 30 s of the end of the run (the router fell behind); they are not in
	// the percentiles.
	Missing               int
	N                     int
	P50, P99, P999, Max   time.Duration
	RatePerSec, DurationS float64
}

func percentilesOf(ds []time.Duration) percentiles {
	if len(ds) == 0 {
		return percentiles{}
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return percentiles{N: len(ds), P50: at(0.5), P99: at(0.99), P999: at(0.999), Max: ds[len(ds)-1]}
}

// plainRead reads every committed record of topic, as a read_committed
// consumer that does nothing with them, and returns the count and the time
// from client creation to the last record.
func plainRead(ctx context.Context, seeds []kgo.Opt, topic string) (int, time.Duration, error) {
	start := time.Now()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return 0, 0, err
	}
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topic)
	cl.Close()
	if err != nil {
		return 0, 0, err
	}
	n := 0
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		n += len(b.Records)
		return nil
	})
	if err != nil {
		return n, 0, err
	}
	return n, time.Since(start), nil
}

// tempDir returns a fresh directory under base.
func tempDir(base, name string) (string, error) {
	dir := filepath.Join(base, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}
