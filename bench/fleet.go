package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// fleetResult is what a deploy and a crash cost three `faultrouter run`
// processes routing a steady rate, as the Helm chart runs them (static group
// members named by their instance IDs, a line per decision logged):
// latency from each input record's timestamp to its committed audit record
// in a run without disruption, in a run over a rolling restart (SIGTERM
// one, start it again on its state directory, wait until it is ready, the
// next) and in a run in which one is killed with SIGKILL and not restarted.
type fleetResult struct {
	Rate            float64 `json:"events_per_s"`
	SessionTimeoutS float64 `json:"session_timeout_s"`
	// Warmup is the fleet's first run on its fresh topics, before Steady:
	// reported, not compared (see runFleet).
	Warmup  latencyResult `json:"warmup"`
	Steady  latencyResult `json:"steady"`
	Restart latencyResult `json:"rolling_restart"`
	// RestartS are the instances' times from SIGTERM to ready again, in
	// the order restarted; RestartP99Over is Restart's p99 over Steady's.
	RestartS       []float64     `json:"restart_sigterm_to_ready_s"`
	RestartP99Over float64       `json:"restart_p99_over_steady"`
	Kill           latencyResult `json:"sigkill"`
	// KilledPartitions are the ingress partitions the killed instance
	// owned; DecidedAgainS is the time from the kill until the first audit
	// record of an event on one of them produced after the kill was read
	// (-1: none within the run).
	KilledPartitions []int32 `json:"killed_partitions"`
	DecidedAgainS    float64 `json:"killed_partitions_decided_again_s"`
	// OverSessionS is DecidedAgainS minus the session timeout.
	OverSessionS float64 `json:"decided_again_minus_session_timeout_s"`
}

// fleetProc is one `faultrouter run` process of the fleet.
type fleetProc struct {
	id, stateDir, metrics string
	cmd                   *exec.Cmd
	done                  chan error
	log                   *os.File
}

// fleet is three router processes in one group on their own topics.
type fleet struct {
	bin, brokers, prefix, workDir string
	partitions                    int
	sessionTimeout                time.Duration
	protocol                      string // --group-protocol; "": run's default
	procs                         map[string]*fleetProc
}

var fleetIDs = []string{"fleet-0", "fleet-1", "fleet-2"}

// start launches the instance id on its state directory and waits until
// its /readyz answers.
func (f *fleet) start(ctx context.Context, id string) (*fleetProc, error) {
	p := f.procs[id]
	if p == nil {
		dir, err := tempDir(f.workDir, id)
		if err != nil {
			return nil, err
		}
		p = &fleetProc{id: id, stateDir: dir}
		f.procs[id] = p
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	p.metrics = "http://" + addr
	if p.log, err = os.OpenFile(filepath.Join(f.workDir, id+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		return nil, err
	}
	args := []string{"run", "--state-dir", p.stateDir, "--instance-id", id, "--group", f.prefix + "router",
		"--metrics-addr", addr, "--partitions", fmt.Sprint(f.partitions), "--static-membership", "--session-timeout", f.sessionTimeout.String()}
	if f.protocol != "" {
		args = append(args, "--group-protocol", f.protocol)
	}
	p.cmd = exec.Command(f.bin, args...)
	p.cmd.Env = append(os.Environ(), "FAULTROUTER_BROKERS="+f.brokers, "FAULTROUTER_TOPIC_PREFIX="+f.prefix)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.log.Close()
		return nil, err
	}
	p.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(p.cmd, p.done)
	for !httpOK(p.metrics + "/readyz") {
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("fleet: %s exited before it was ready (%v); see %s", id, err, p.log.Name())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return p, nil
}

// signal sends sig to the instance id and waits until it exited.
func (f *fleet) signal(id string, sig syscall.Signal) error {
	p := f.procs[id]
	if p == nil || p.cmd == nil {
		return nil
	}
	p.cmd.Process.Signal(sig)
	var err error
	select {
	case err = <-p.done:
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		err = <-p.done
		err = fmt.Errorf("fleet: %s did not stop within 60 s of %v: %v", id, sig, err)
	}
	p.cmd = nil
	p.log.Close()
	if sig == syscall.SIGKILL {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fleet: %s exited with %v on %v; see %s", id, err, sig, p.log.Name())
	}
	return nil
}

// stopAll stops every running instance with SIGTERM.
func (f *fleet) stopAll() error {
	var first error
	for _, id := range fleetIDs {
		if err := f.signal(id, syscall.SIGTERM); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// runFleet measures the three runs of fleetResult at rate, each d long
// (the restart run as long as its restarts take and d more, the kill run
// the session timeout and d more), on fresh topics.
func runFleet(ctx context.Context, out io.Writer, c config, seeds []kgo.Opt, bin string, rate float64, d time.Duration) (fleetResult, error) {
	res := fleetResult{Rate: rate, SessionTimeoutS: c.sessionTimeout.Seconds(), DecidedAgainS: -1}
	prefix := fmt.Sprintf("bench-fleet-%d.", time.Now().Unix())
	set, err := topicspec.Load(prefix)
	if err != nil {
		return res, err
	}
	// the first instance creates the topics as `faultrouter run` does
	// (--partitions: ingress, audit and the others alike, so that an audit
	// record's partition is its input's)
	topics := routerTopics(set)
	w, err := newWorkload(topics.Ingress, "fleet", 3)
	if err != nil {
		return res, err
	}
	f := &fleet{bin: bin, brokers: c.brokers, prefix: prefix, workDir: c.workDir, partitions: c.partitions, sessionTimeout: c.sessionTimeout, protocol: c.groupProtocol, procs: map[string]*fleetProc{}}
	defer f.stopAll()
	for _, id := range fleetIDs {
		if _, err := f.start(ctx, id); err != nil {
			return res, err
		}
	}
	group := prefix + "router"
	// the steady run starts on a settled group: every instance's first
	// assignment restored and its first transaction behind it
	if _, _, err := largestMember(ctx, seeds, group, topics.Ingress); err != nil {
		return res, err
	}
	time.Sleep(2 * time.Second)
	next := 0
	// measure runs one latency run of the steady rate for d, with disrupt
	// (when not nil) running beside it from 2 s in; the run's events are
	// produced for max(d, disrupt's time + tail).
	measure := func(name string, dst *latencyResult, d time.Duration, disrupt func(context.Context) error, observe func(sent, read time.Time, p int32)) error {
		// each event's times go to fleet-NAME.latency.tsv in the work
		// directory, so that a run's tail can be traced to the instance
		// logs of the same moments
		trace, err := newLatencyTrace(filepath.Join(f.workDir, "fleet-"+name+".latency.tsv"))
		if err != nil {
			return err
		}
		defer trace.close()
		traced := func(sent, read time.Time, p int32) {
			trace.add(sent, read, p)
			if observe != nil {
				observe(sent, read, p)
			}
		}
		errc := make(chan error, 1)
		if disrupt != nil {
			go func() {
				select {
				case <-time.After(2 * time.Second):
					errc <- disrupt(ctx)
				case <-ctx.Done():
					errc <- ctx.Err()
				}
			}()
		}
		p, err := observedLatency(ctx, seeds, w, topics.Audit, next, rate, d, traced)
		next += int(rate*d.Seconds()) + 1
		if disrupt != nil {
			if derr := <-errc; derr != nil {
				return derr
			}
		}
		if err != nil {
			return err
		}
		*dst = latencyResult{Rate: rate, N: p.N, P50: ms(p.P50), P99: ms(p.P99), P999: ms(p.P999), MaxMs: ms(p.Max), Missing: p.Missing}
		return nil
	}

	// A fresh group's first seconds on fresh topics are not its steady
	// state: each instance's first transactions add each output partition
	// for the first time, and the broker had the earlier runs' work just
	// behind it; one make bench run had a first few seconds with p99 2 s
	// and a steady p99 of 200-300 ms after them. So the fleet routes the
	// rate for half a run first; that run is reported and compared to
	// nothing.
	warm := d / 2
	step(out, "three `faultrouter run` processes (static members, session timeout %s) at %.0f events/s: a warm-up of %s, then %s", c.sessionTimeout, rate, warm, d)
	if err := measure("warmup", &res.Warmup, warm, nil, nil); err != nil {
		return res, err
	}
	if err := measure("steady", &res.Steady, d, nil, nil); err != nil {
		return res, err
	}

	// a rolling restart: about 2 s per instance on this machine, and d
	// after the last one
	restartD := d + time.Duration(len(fleetIDs))*3*time.Second
	step(out, "rolling restart of the three (SIGTERM, start, ready, the next) at %.0f events/s over %s", rate, restartD)
	restart := func(ctx context.Context) error {
		for _, id := range fleetIDs {
			t0 := time.Now()
			if err := f.signal(id, syscall.SIGTERM); err != nil {
				return err
			}
			if _, err := f.start(ctx, id); err != nil {
				return err
			}
			res.RestartS = append(res.RestartS, time.Since(t0).Seconds())
		}
		return nil
	}
	if err := measure("restart", &res.Restart, restartD, restart, nil); err != nil {
		return res, err
	}
	if res.Steady.P99 > 0 {
		res.RestartP99Over = res.Restart.P99 / res.Steady.P99
	}

	// SIGKILL of the instance that owns the most partitions, not restarted
	victim, owned, err := largestMember(ctx, seeds, group, topics.Ingress)
	if err != nil {
		return res, err
	}
	res.KilledPartitions = owned
	killD := c.sessionTimeout + d
	step(out, "SIGKILL of %s (partitions %v) at %.0f events/s over %s", victim, owned, rate, killD)
	var (
		mu       sync.Mutex
		killedAt time.Time
		again    time.Time
	)
	kill := func(context.Context) error {
		mu.Lock()
		killedAt = time.Now()
		mu.Unlock()
		return f.signal(victim, syscall.SIGKILL)
	}
	observe := func(sent, read time.Time, p int32) {
		mu.Lock()
		defer mu.Unlock()
		if !killedAt.IsZero() && sent.After(killedAt) && slices.Contains(owned, p) && (again.IsZero() || read.Before(again)) {
			again = read
		}
	}
	if err := measure("kill", &res.Kill, killD, kill, observe); err != nil {
		return res, err
	}
	if !again.IsZero() {
		res.DecidedAgainS = again.Sub(killedAt).Seconds()
		res.OverSessionS = res.DecidedAgainS - c.sessionTimeout.Seconds()
	}
	return res, nil
}

// largestMember returns the instance ID of the group member that owns the
// most partitions of topic, and those partitions.
func largestMember(ctx context.Context, seeds []kgo.Opt, group, topic string) (string, []int32, error) {
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return "", nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for range 100 { // until the group is stable after the restarts
		d, err := adm.DescribeGroups(ctx, group)
		if err == nil && d.Error() == nil && d[group].State == "Stable" {
			var id string
			var best []int32
			for _, m := range d[group].Members {
				ca, ok := m.Assigned.AsConsumer()
				if !ok || m.InstanceID == nil {
					continue
				}
				for _, t := range ca.Topics {
					if t.Topic == topic && len(t.Partitions) > len(best) {
						id, best = *m.InstanceID, slices.Sorted(slices.Values(t.Partitions))
					}
				}
			}
			if id != "" {
				return id, best, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return "", nil, errors.New("fleet: the group did not settle with partitions assigned")
}

// latencyTrace writes one line per event of a latency run: the times it
// was sent (ms) and its audit record read (RFC 3339), its latency in ms and
// its partition.
type latencyTrace struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func newLatencyTrace(path string) (*latencyTrace, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "sent\tread\tlatency_ms\tpartition")
	return &latencyTrace{f: f, w: w}, nil
}

func (t *latencyTrace) add(sent, read time.Time, p int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%s\t%s\t%d\t%d\n", sent.UTC().Format(time.RFC3339Nano), read.UTC().Format(time.RFC3339Nano), read.Sub(sent).Milliseconds(), p)
}

func (t *latencyTrace) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.w.Flush()
	t.f.Close()
}
