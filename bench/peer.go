package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router"
)

// peerResult is the Kafka Streams peer's run on the backlog.
type peerResult struct {
	PerSec     float64 `json:"events_per_s"`
	OverRaw    float64 `json:"peer_over_raw"`
	RouterOver float64 `json:"router_over_peer"`
	Processed  int64   `json:"processed"`
	Routed     int64   `json:"routed"`
	RunningS   float64 `json:"start_to_running_s"`
	// CPUPerEventUs is the JVM's process CPU (every thread: stream threads,
	// clients, RocksDB, JIT and GC) from the application's first RUNNING
	// state until its offsets reached the backlog's end, an event of the
	// backlog; WholeCPUPerEventUs the JVM's CPU from launch to exit (its
	// start-up and the warm-up run included) over the same events.
	// RouterCPUOver is the router's CPU an event over CPUPerEventUs.
	CPUPerEventUs      float64 `json:"cpu_us_per_event,omitempty"`
	WholeCPUPerEventUs float64 `json:"whole_process_cpu_us_per_event,omitempty"`
	RouterCPUOver      float64 `json:"router_cpu_over_peer,omitempty"`
}

// runPeer runs the Kafka Streams peer on the backlog, the partitions of topic
// up to ends, under the application id appID, and puts its figures in res.
// With --peer=false, or when a tool it needs is missing, it puts why in res
// instead (and prints a line for a missing tool).
func runPeer(ctx context.Context, c config, out io.Writer, res *result, seeds []kgo.Opt, topic string,
	ends map[int32]int64, outs [2]string, appID string) error {
	n := 0
	for _, o := range ends {
		n += int(o)
	}
	switch why := peerMissing(); {
	case !c.peer:
		res.PeerSkipped = "--peer=false"
	case why != "":
		res.PeerSkipped = why
		step(out, "Kafka Streams peer skipped: %s (it needs mvn, java and javac; --peer=false skips it)", why)
	default:
		commitMs := max(1, int(res.BacklogCommitMs+0.5))
		step(out, "Kafka Streams peer: exactly_once_v2, %d stream threads, commit interval %d ms (the router's), RocksDB store behind its record cache, same backlog",
			runtime.NumCPU(), commitMs)
		stateDir, err := tempDir(c.workDir, "streams-peer")
		if err != nil {
			return err
		}
		p, err := streamsPeer(ctx, seeds, c.brokers, topic, ends, outs, appID, stateDir,
			filepath.Join(c.workDir, "streams-peer.log"), c.peerRouted, min(c.peerWarmup, n), commitMs)
		if err != nil {
			return err
		}
		p.OverRaw, p.RouterOver = p.PerSec/res.RawPerSec, res.RouterPerSec/p.PerSec
		if p.CPUPerEventUs > 0 && res.RouterCPU != nil {
			p.RouterCPUOver = res.RouterCPU.PerEventUs / p.CPUPerEventUs
		}
		res.Peer = &p
	}
	return nil
}

// peerMissing returns why the peer cannot be built here, or "" when it can:
// it needs mvn, java and javac.
func peerMissing() string {
	var missing []string
	for _, tool := range []string{"mvn", "java", "javac"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return strings.Join(missing, ", ") + " not found"
}

// streamsPeer builds the Kafka Streams peer (bench/streams-peer, with its
// build.sh) and runs it on the backlog: partitions of topic in up to the
// offsets in ends, under a fresh application id, writing to the audit and
// routed topics in outs, and stops it by closing its standard input. It returns the backlog's events per second from the
// application's first RUNNING state until its committed offsets reach ends,
// polled every 50 ms as the router's routed count is. Before that, the peer
// warms its JVM up on the first warmup records of the backlog under another
// application id (not timed). The peer's output goes to log. It runs tuned
// as its users would tune it: a stream thread per core, a commit every
// commitMs (the router's commit interval on the backlog), a record cache as
// large as the router's Pebble block cache, and the router's poll bound
// under a backlog.
func streamsPeer(ctx context.Context, seeds []kgo.Opt, brokers, topic string, ends map[int32]int64, outs [2]string,
	appID, stateDir, log string, routedPercent, warmup, commitMs int) (peerResult, error) {
	rc := router.Default()
	build := exec.CommandContext(ctx, filepath.Join("bench", "streams-peer", "build.sh"))
	build.Stderr = os.Stderr
	cp, err := build.Output()
	if err != nil {
		return peerResult{}, fmt.Errorf("build the Kafka Streams peer (run from the repository root, or pass --peer=false): %w", err)
	}
	var endList []string
	for p, o := range ends {
		endList = append(endList, fmt.Sprintf("%d:%d", p, o))
	}
	sort.Strings(endList)
	logf, err := os.Create(log)
	if err != nil {
		return peerResult{}, err
	}
	defer logf.Close()
	cmd := exec.Command("java", "-cp", strings.TrimSpace(string(cp)), "StreamsPeer",
		"--bootstrap="+brokers, "--application-id="+appID, "--input="+topic,
		"--audit="+outs[0], "--routed="+outs[1], "--state-dir="+stateDir,
		fmt.Sprintf("--routed-percent=%d", routedPercent),
		// the router's client settings, where Streams has them: its poll and
		// fetch bounds, the producer batch bound of its output topics (the
		// broker's default message limit, as the passthrough's) and its 10 ms
		// request retry backoff
		fmt.Sprintf("--max-poll-records=%d", rc.MaxBatchRecords), fmt.Sprintf("--fetch-max-bytes=%d", rc.MaxPollBytes),
		fmt.Sprintf("--batch-bytes=%d", 1<<20), "--retry-backoff-ms=10",
		fmt.Sprintf("--threads=%d", runtime.NumCPU()), fmt.Sprintf("--commit-interval-ms=%d", commitMs),
		fmt.Sprintf("--cache-bytes=%d", 64<<20),
		fmt.Sprintf("--warmup-records=%d", warmup),
		"--ends="+strings.Join(endList, ","))
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return peerResult{}, err
	}
	stdin, err := cmd.StdinPipe() // closing it stops the peer
	if err != nil {
		return peerResult{}, err
	}
	launched := time.Now()
	if err := cmd.Start(); err != nil {
		return peerResult{}, err
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
			io.WriteString(logf, sc.Text()+"\n")
		}
	}()
	var stopped bool
	stop := func() (processed, routed int64, err error) {
		if stopped {
			return 0, 0, nil
		}
		stopped = true
		stdin.Close()
		timeout := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
		defer timeout.Stop()
		for l := range lines {
			fmt.Sscanf(l, "processed=%d routed=%d", &processed, &routed)
		}
		return processed, routed, cmd.Wait()
	}
	fail := func(err error) (peerResult, error) {
		stop()
		return peerResult{}, fmt.Errorf("Kafka Streams peer (its output: %s): %w", log, err)
	}

	// its clock starts when the application first runs: partitions assigned,
	// the (empty) store restored, the transactional producer ready
	var (
		start time.Time
		cpu0  time.Duration
		cpuOK bool
	)
	for start.IsZero() {
		select {
		case l, ok := <-lines:
			if !ok {
				return fail(errors.New("exited before it was running"))
			}
			if l == "running" {
				start = time.Now()
				cpu0, cpuOK = processCPU(cmd.Process.Pid)
			}
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		offs, err := adm.FetchOffsets(ctx, appID)
		if err == nil && reached(offs, topic, ends) {
			break
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	took := time.Since(start)
	cpu1, cpuOK1 := processCPU(cmd.Process.Pid)
	processed, routed, err := stop()
	if err != nil {
		return peerResult{}, fmt.Errorf("Kafka Streams peer exited with %v (its output: %s)", err, log)
	}
	n := int64(0)
	for _, o := range ends {
		n += o
	}
	p := peerResult{PerSec: float64(n) / took.Seconds(), Processed: processed, Routed: routed,
		RunningS: start.Sub(launched).Seconds()}
	if cpuOK && cpuOK1 && n > 0 {
		p.CPUPerEventUs = float64((cpu1 - cpu0).Microseconds()) / float64(n)
		if st := cmd.ProcessState; st != nil {
			p.WholeCPUPerEventUs = float64((st.UserTime() + st.SystemTime()).Microseconds()) / float64(n)
		}
	}
	return p, nil
}

// reached reports whether the committed offsets of every partition in ends
// are at or past its end.
func reached(offs kadm.OffsetResponses, topic string, ends map[int32]int64) bool {
	for p, end := range ends {
		if end == 0 {
			continue
		}
		o, ok := offs.Lookup(topic, p)
		if !ok || o.Err != nil || o.At < end {
			return false
		}
	}
	return true
}
