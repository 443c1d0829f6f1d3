package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// rssResult is the memory of a `faultrouter run` process holding tasks live
// task states.
type rssResult struct {
	Tasks      int     `json:"tasks"`
	RSSMiB     float64 `json:"rss_mib"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	RouteS     float64 `json:"route_s"`
}

// rss runs the faultrouter binary as its own process, produces the first
// attempt of tasks distinct tasks (so that every one of them is a live task
// state), waits until the router has routed them all and reads the process's
// resident set size (and its peak) from /proc.
func rss(ctx context.Context, bin, brokers string, seeds []kgo.Opt, prefix, workDir string, tasks int) (rssResult, error) {
	stateDir, err := tempDir(workDir, "rss-state")
	if err != nil {
		return rssResult{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rssResult{}, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.CommandContext(ctx, bin, "run", "--state-dir", stateDir, "--instance-id", "rss",
		"--group", prefix+"router", "--metrics-addr", addr, "--log-level", "error")
	cmd.Env = append(os.Environ(), "FAULTROUTER_BROKERS="+brokers, "FAULTROUTER_TOPIC_PREFIX="+prefix)
	logs, err := os.Create(filepath.Join(workDir, "rss-router.log"))
	if err != nil {
		return rssResult{}, err
	}
	defer logs.Close()
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := cmd.Start(); err != nil {
		return rssResult{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	base := "http://" + addr
	for !httpOK(base + "/readyz") {
		if err := ctx.Err(); err != nil {
			return rssResult{}, err
		}
		if cmd.ProcessState != nil {
			return rssResult{}, fmt.Errorf("rss: router exited; see %s", logs.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, seeds...), kgo.MaxBufferedRecords(50_000))...)
	if err != nil {
		return rssResult{}, err
	}
	defer cl.Close()
	set, err := topicspec.Load(prefix)
	if err != nil {
		return rssResult{}, err
	}
	ingress, err := set.Name("ingress")
	if err != nil {
		return rssResult{}, err
	}
	w, err := newWorkload(ingress, "rss", 7)
	if err != nil {
		return rssResult{}, err
	}
	start := time.Now()
	if _, err := w.produce(ctx, cl, 0, tasks, 1); err != nil {
		return rssResult{}, err
	}
	for {
		n, err := scrape(base+"/metrics", "faultrouter_routed_total")
		if err != nil {
			return rssResult{}, err
		}
		if n >= float64(tasks) {
			break
		}
		select {
		case <-ctx.Done():
			return rssResult{}, fmt.Errorf("rss: routed %.0f of %d: %w", n, tasks, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	res := rssResult{Tasks: tasks, RouteS: time.Since(start).Seconds()}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return rssResult{}, err
	}
	res.RSSMiB = procKiB(string(status), "VmRSS:") / 1024
	res.PeakRSSMiB = procKiB(string(status), "VmHWM:") / 1024
	return res, nil
}

func procKiB(status, field string) float64 {
	for _, l := range strings.Split(status, "\n") {
		if strings.HasPrefix(l, field) {
			f := strings.Fields(l)
			if len(f) >= 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				return v
			}
		}
	}
	return 0
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// scrape sums every sample of a metric family in a Prometheus text page.
func scrape(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}
