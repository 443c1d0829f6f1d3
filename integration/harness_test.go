package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
)

var (
	binary  string // the faultrouter binary under test
	brokers string // FAULTROUTER_TEST_BROKERS
)

func TestMain(m *testing.M) {
	brokers = os.Getenv("FAULTROUTER_TEST_BROKERS")
	if brokers == "" {
		if os.Getenv("FAULTROUTER_REQUIRE_BROKER") != "" {
			fmt.Fprintln(os.Stderr, "integration: FAULTROUTER_REQUIRE_BROKER is set but FAULTROUTER_TEST_BROKERS is empty; run `make test`")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "integration: SKIPPING every test: no broker (FAULTROUTER_TEST_BROKERS unset); `make test` starts one")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "faultrouter-it-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "faultrouter")
	build := exec.Command("go", "build", "-o", binary, "../cmd/faultrouter")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: build:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "integration: testing %s against the real broker at %s\n", binary, brokers)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's isolated world: a topic prefix, a consumer group and a
// state directory per router instance.
type env struct {
	t       *testing.T
	prefix  string
	brokers string   // what the commands connect to: the test broker unless a test sets another listener
	vars    []string // more environment of every command (KEY=VALUE, winning over the inherited)
	flags   []string // flags appended to every command
}

func newEnv(t *testing.T) *env {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	return &env{t: t, prefix: fmt.Sprintf("it-%s-%06d.", name, rand.IntN(1_000_000)), brokers: brokers}
}

func (e *env) cmdEnv() []string {
	return append(append(os.Environ(), "FAULTROUTER_BROKERS="+e.brokers, "FAULTROUTER_TOPIC_PREFIX="+e.prefix), e.vars...)
}

// cli runs the binary to completion and returns its stdout; it fails the test
// when the command fails.
func (e *env) cli(stdin string, args ...string) string {
	e.t.Helper()
	out, errOut, err := e.tryCLI(stdin, args...)
	if err != nil {
		e.t.Fatalf("faultrouter %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// tryCLI runs the binary to completion and returns stdout, stderr and the error.
func (e *env) tryCLI(stdin string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append(args, e.flags...)...)
	cmd.Env = e.cmdEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// router is a running `faultrouter run` process.
type router struct {
	cmd     *exec.Cmd
	logs    *lockedbuf.Buffer
	metrics string
	done    chan error
}

// startRouter starts `faultrouter run` with its own state directory and
// waits until /readyz answers.
func (e *env) startRouter(instance, stateDir string, extra ...string) *router {
	e.t.Helper()
	return e.startRouterBin(binary, instance, stateDir, extra...)
}

// startRouterBin is startRouter with another build of the binary.
func (e *env) startRouterBin(bin, instance, stateDir string, extra ...string) *router {
	e.t.Helper()
	r := e.launchRouter(bin, instance, stateDir, extra...)
	if !waitFor(90*time.Second, func() bool { return httpOK(r.metrics + "/readyz") }) {
		r.kill()
		e.t.Fatalf("router %s did not become ready; logs:\n%s", instance, r.logs.String())
	}
	return r
}

// launchRouter is startRouterBin without waiting until it is ready.
func (e *env) launchRouter(bin, instance, stateDir string, extra ...string) *router {
	e.t.Helper()
	port := freePort(e.t)
	args := append([]string{"run", "--state-dir", stateDir, "--instance-id", instance,
		"--group", e.prefix + "router", "--partitions", "3",
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}, extra...)
	cmd := exec.Command(bin, append(args, e.flags...)...)
	cmd.Env = e.cmdEnv()
	logs := &lockedbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if dir := os.Getenv("FAULTROUTER_ROUTER_LOGS"); dir != "" { // every line of every router, kept for a post-mortem
		f, err := os.CreateTemp(dir, e.prefix+instance+"-*.log")
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { f.Close() })
		w := io.MultiWriter(logs, f)
		cmd.Stdout, cmd.Stderr = w, w
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	r := &router{cmd: cmd, logs: logs, metrics: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	e.t.Cleanup(func() { r.kill() })
	return r
}

// stop sends SIGTERM and waits for a clean exit.
func (r *router) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			t.Fatalf("router exited with %v; logs:\n%s", err, r.logs.String())
		}
	case <-time.After(60 * time.Second):
		r.kill()
		t.Fatalf("router did not stop within 60 s")
	}
}

// kill sends SIGKILL: no clean shutdown, no flush, no close of Pebble.
func (r *router) kill() {
	if r.cmd.ProcessState != nil {
		return
	}
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case err := <-r.done:
		r.done <- err
	case <-time.After(10 * time.Second):
	}
}

// tail waits settle (time for records still on their way, when a test
// checks that something did not happen), then prints every committed record
// of topic.
func (e *env) tail(topic string, settle time.Duration) []map[string]any {
	e.t.Helper()
	time.Sleep(settle)
	return e.tailNow(topic)
}

// tailNow prints every record of topic committed by now (tail --until-end):
// exact, however slow the broker is to answer the first fetch.
func (e *env) tailNow(topic string) []map[string]any {
	e.t.Helper()
	out := e.cli("", "tail", "--topic", topic, "--from-beginning", "--until-end", "--format", "json")
	return parseLines(e.t, out)
}

// tailUntil tails a topic until want(records) holds or the deadline passes.
func (e *env) tailUntil(topic string, deadline time.Duration, want func([]map[string]any) bool) []map[string]any {
	e.t.Helper()
	var recs []map[string]any
	waitFor(deadline, func() bool {
		recs = e.tailNow(topic)
		return want(recs)
	})
	return recs
}

func parseLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("tail printed a line that is not JSON: %q: %v", sc.Text(), err)
		}
		recs = append(recs, m)
	}
	return recs
}

// get walks a decoded JSON object along a dotted path.
func get(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func str(m map[string]any, path string) string {
	s, _ := get(m, path).(string)
	return s
}

func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func httpOK(url string) bool {
	out, err := httpGet(url)
	return err == nil && out != ""
}
