package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/taskid"
)

// The Python package (clients/python) against this build: its task IDs, and
// its pytest suite against a router on the real broker. interop.sh installs
// the package and its pinned test dependencies (openai, anthropic,
// langchain-core) into the cached virtual environment.

const pythonClient = "../clients/python"

// Guards "the same task IDs as the Go generator, byte for byte": faultrouter's
// task_id in Python and pkg/taskid agree on every row of a table that covers
// empty and binary content, non-ASCII and empty fields, an authorization,
// fields whose concatenations collide, and a large input.
func TestPythonTaskIDsMatchGo(t *testing.T) {
	type row struct {
		Content       []byte `json:"content"` // base64 in JSON, as encoding/json writes []byte
		User          string `json:"user"`
		Action        string `json:"action"`
		Authorization string `json:"authorization"`
	}
	rows := []row{
		{[]byte("contract v3, page 1-12"), "alice@example.com", "contract_review", ""},
		{[]byte("refund order 1042: 30.00 EUR"), "bob", "refund", "approval-7"},
		{[]byte{}, "u", "a", ""},
		{[]byte{0, 0xff, 0xc3, 0x01, '\n'}, "u", "a", "auth"},
		{[]byte("合同第三版"), "张伟", "合同审核", "批准-1"},
		{[]byte("x"), "ab", "c", ""},
		{[]byte("x"), "a", "bc", ""},
		{[]byte("Cafe\u0301"), "Café", "REFUND", " "},
		{bytes.Repeat([]byte("invoice line\n"), 200_000), "u-17", "refund", ""},
	}
	in, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	python := interop(t, "FAULTROUTER_PYTHON", "python")
	const script = `
import base64, json, sys
from faultrouter import task_id
for r in json.load(sys.stdin):
    print(task_id(base64.b64decode(r["content"]), user=r["user"], action=r["action"], authorization=r["authorization"]))
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, errOut.String())
	}
	got := strings.Fields(string(out))
	if len(got) != len(rows) {
		t.Fatalf("python printed %d IDs for %d rows:\n%s", len(got), len(rows), out)
	}
	for i, r := range rows {
		want := taskid.FromContent(r.Content, r.User, r.Action, r.Authorization)
		if got[i] != want {
			t.Errorf("row %d (user %q, action %q, authorization %q, %d bytes): Python %s, Go %s",
				i, r.User, r.Action, r.Authorization, len(r.Content), got[i], want)
		}
	}
}

// pytestPassed fails the test unless pytest's summary says every test passed.
func pytestPassed(t *testing.T, out []byte) {
	t.Helper()
	if !regexp.MustCompile(`(?m)^\d+ passed(, \d+ (deselected|skipped))? in `).Match(out) {
		t.Fatalf("pytest did not report every test passed:\n%s", out)
	}
}

// docBlocks returns the Python code blocks of a Markdown page whose first line
// names their file ("# worker.py: ..."), by file name, in page order.
func docBlocks(t *testing.T, page string) (names []string, files map[string]string) {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	files = map[string]string{}
	for _, m := range regexp.MustCompile("(?s)```python\n(# ([a-z_]+\\.py):[^\n]*\n.*?)```").FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[2])
		files[m[2]] = m[1]
	}
	return names, files
}

// Guards docs/getting-started.md as a new user follows it: its worker.py and
// retries.py, extracted from the page and run as written with the package
// installed by `pip install ./clients/python` (interop.sh), against the
// package's fake API and a router and console on the real broker (standing
// in for `faultrouter demo --serve`). The 429 is retried when due (the retry
// record is written no sooner than the decision's not_before, and the second
// attempt completes the task), the refusal opens a MODEL_REFUSAL review item,
// and the console shows both: the refusal in its review queue, the retry and
// the success in the rate-limited task's timeline.
func TestGettingStarted(t *testing.T) {
	names, files := docBlocks(t, "../docs/getting-started.md")
	if strings.Join(names, " ") != "worker.py retries.py" {
		t.Fatalf("docs/getting-started.md: Python blocks %v, want worker.py then retries.py", names)
	}
	dir := t.TempDir()
	for name, code := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	python := interop(t, "FAULTROUTER_PYTHON", "python")
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	c := e.startConsole(fmt.Sprintf("users:\n  - {name: demo, password_bcrypt: %q, roles: [reviewer, operator], owners: [\"*\"]}\n",
		e.hashPassword("demo-pw")))

	// the fake API, as `python -m faultrouter.fake` in step 3
	port := freePort(t)
	fake := exec.Command(python, "-m", "faultrouter.fake", "--port", fmt.Sprint(port))
	fake.Dir = dir
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Process.Kill(); fake.Wait() })
	if !waitFor(30*time.Second, func() bool {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			conn.Close()
		}
		return err == nil
	}) {
		t.Fatal("the fake API did not listen")
	}
	env := append(e.cmdEnv(), fmt.Sprintf("OPENAI_BASE_URL=http://127.0.0.1:%d/v1", port), "OPENAI_API_KEY=fake")
	runPy := func(name string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, python, name)
		cmd.Dir, cmd.Env = dir, env
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("python %s: %v\n%s\n%s", name, err, out.String(), errOut.String())
		}
		t.Logf("python %s:\n%s", name, out.String())
		return out.String()
	}

	out := runPy("worker.py")
	limited := regexp.MustCompile(`(?m)^(t1-[a-z2-7]{26}) failed: RateLimitError`).FindStringSubmatch(out)
	refused := regexp.MustCompile(`(?m)^(t1-[a-z2-7]{26}) answered: \(refused: `).FindStringSubmatch(out)
	if limited == nil || refused == nil {
		t.Fatalf("worker.py did not print a rate-limited and a refused ticket:\n%s", out)
	}
	rate, ref := limited[1], refused[1]
	if out := runPy("retries.py"); !strings.Contains(out, rate+" retry 1, attempt 2: Echo: ") {
		t.Fatalf("retries.py did not take %s's retry and get an answer:\n%s", rate, out)
	}

	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool {
		return len(byTask(r, rate)) >= 2 && len(byTask(r, ref)) >= 1
	})
	var got []string
	for _, r := range byTask(audit, rate) {
		got = append(got, str(r, "decision.class")+"/"+str(r, "decision.route"))
	}
	if strings.Join(got, " ") != "RATE_LIMITED/RETRY SUCCEEDED/COMPLETE" {
		t.Fatalf("the rate-limited ticket was routed %v, want a retry then completion", got)
	}
	notBefore, err := time.Parse(time.RFC3339Nano, str(byTask(audit, rate)[0], "decision.retry.not_before"))
	if err != nil {
		t.Fatal(err)
	}
	if d := get(byTask(audit, rate)[0], "decision.retry.delay_ms"); d != float64(2000) {
		t.Errorf("the 429's retry waits %v ms, want the retry-after's 2000", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var published []time.Time
	for _, r := range readTopic(ctx, t, e.prefix+"ai.tasks.retry", true) {
		if string(r.Key) == rate {
			published = append(published, r.Timestamp)
		}
	}
	if len(published) != 1 || published[0].Before(notBefore.Truncate(time.Millisecond)) {
		t.Fatalf("retry of %s published at %v, want once, not before %v", rate, published, notBefore)
	}
	if r := byTask(audit, ref); str(r[0], "decision.class")+"/"+str(r[0], "decision.route") != "MODEL_REFUSAL/REVIEW" {
		t.Fatalf("the refused ticket was routed %v, want MODEL_REFUSAL/REVIEW", r[0]["decision"])
	}

	demo := newHTTPPerson(t, c.url)
	demo.login("demo", "demo-pw")
	if !waitFor(30*time.Second, func() bool {
		_, page := demo.get("/review")
		return strings.Contains(page, ref) && strings.Contains(page, "MODEL_REFUSAL")
	}) {
		_, page := demo.get("/review")
		t.Fatalf("the console's review queue does not show %s as MODEL_REFUSAL:\n%s", ref, page)
	}
	if _, page := demo.get("/task?id=" + rate); !strings.Contains(page, "RATE_LIMITED") || !strings.Contains(page, "SUCCEEDED") {
		t.Fatalf("the console's timeline of %s does not show the 429 and the success:\n%s", rate, page)
	}
}

// Guards the Python package without a router: its checks and wire format,
// task IDs, and each row of the SDK mapping table through the pinned openai
// and anthropic SDKs (sync and async) and langchain-core against the fake
// API; each row's test fails if the row is wrong. It runs on every Python
// the package supports that the machine has (FAULTROUTER_PYTHON_VERSIONS,
// default 3.10 to 3.13), each in its own virtual environment of the pinned
// test requirements (interop.sh python 3.N); a version the machine lacks
// is skipped and named.
func TestPythonClientSDKs(t *testing.T) {
	versions := strings.Fields(os.Getenv("FAULTROUTER_PYTHON_VERSIONS"))
	if len(versions) == 0 {
		versions = []string{"3.10", "3.11", "3.12", "3.13"}
	}
	var ran atomic.Int32
	t.Cleanup(func() {
		if ran.Load() == 0 && !t.Failed() {
			t.Error("no Python version of the list is on this machine")
		}
	})
	for _, v := range versions {
		t.Run("python"+v, func(t *testing.T) {
			t.Parallel() // each its own virtual environment; mostly waiting on PyPI
			cmd := exec.Command("./interop.sh", "python", v)
			cmd.Stderr = os.Stderr
			py, err := cmd.Output()
			if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 3 {
				t.Skipf("no Python %s on this machine", v)
			}
			if err != nil {
				t.Fatalf("interop.sh python %s: %v", v, err)
			}
			python := strings.TrimSpace(string(py))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd = exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", "--ignore=tests/test_router.py")
			cmd.Dir = pythonClient
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("pytest on Python %s: %v\n%s", v, err, out)
			}
			pytestPassed(t, out)
			if got, err := exec.Command(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output(); err != nil || strings.TrimSpace(string(got)) != v {
				t.Fatalf("the virtual environment runs Python %q (%v), want %s", got, err, v)
			}
			ran.Add(1)
		})
	}
}

// docShellBlocks returns the sh code blocks of a Markdown page, in page order.
func docShellBlocks(t *testing.T, page string) []string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// Guards docs/getting-started.md run as written, every code block of it, the
// way a new user runs them: step 1's shell block at the repository's root
// (go build, a fresh virtual environment, pip install of the package and the
// openai SDK from PyPI), step 2's `./faultrouter demo --serve` in the
// background as the first terminal, steps 3 to 5 in a second one (the fake
// API on 127.0.0.1:8000, worker.py and retries.py as the page saves them).
// It asserts what the page promises: the 429's retry is taken as attempt 2
// and answered, and the console of the demo (signed in with the password it
// printed) holds the refusal in its review queue and shows the 429, the retry
// and the success in the rate-limited task's timeline. The page's ports
// (9092, 8080, 8000) must be free.
func TestGettingStartedAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and installs the package from PyPI")
	}
	for _, port := range []int{9092, 8080, 8000} {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
			t.Fatalf("port %d, which docs/getting-started.md uses, is taken: %v", port, err)
		} else {
			l.Close()
		}
	}
	sh := docShellBlocks(t, "../docs/getting-started.md")
	if len(sh) != 5 || !strings.Contains(sh[1], "demo --serve") || !strings.Contains(sh[2], "faultrouter.fake &") ||
		strings.TrimSpace(sh[3]) != "python worker.py" || strings.TrimSpace(sh[4]) != "python retries.py" {
		t.Fatalf("docs/getting-started.md: shell blocks %q, want install, demo --serve, the fake API, worker.py, retries.py", sh)
	}
	_, files := docBlocks(t, "../docs/getting-started.md")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, code := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// the first terminal's output goes to demo.out; the second terminal is the script's own
	demoOut := filepath.Join(dir, "demo.out")
	script := strings.Join([]string{
		"set -euo pipefail",
		"cd " + root,
		"rm -rf .venv",
		sh[0],
		"(\n" + sh[1] + ") >" + demoOut + " 2>&1 &",
		`for i in $(seq 1 600); do grep -q "Operator console:" ` + demoOut + ` && break; sleep 0.5; done`,
		`grep -q "Operator console:" ` + demoOut + ` || { echo "demo --serve did not come up"; exit 1; }`,
		"cd " + dir,
		sh[2],
		`python -c 'import socket, time
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", 8000), 1).close(); break
    except OSError:
        time.sleep(0.2)'`,
		"echo '>>> worker.py'",
		sh[3],
		"echo '>>> retries.py'",
		sh[4],
	}, "\n")
	log, err := os.Create(filepath.Join(dir, "terminal.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Stdout, cmd.Stderr = log, log // files, not pipes: the background terminal outlives bash
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "FAULTROUTER_BROKERS=", "OPENAI_BASE_URL=", "VIRTUAL_ENV=")
	err = cmd.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // Ctrl-C in both terminals
		time.Sleep(2 * time.Second)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		os.RemoveAll(filepath.Join(root, ".venv"))
		os.Remove(filepath.Join(root, "faultrouter"))
	})
	err = cmd.Wait()
	terminal, _ := os.ReadFile(log.Name())
	demo, _ := os.ReadFile(demoOut)
	if err != nil {
		t.Fatalf("the page's blocks: %v\nsecond terminal:\n%s\nfirst terminal (demo --serve):\n%s", err, terminal, demo)
	}
	t.Logf("second terminal:\n%s", terminal)
	out := string(terminal)
	limited := regexp.MustCompile(`(?m)^(t1-[a-z2-7]{26}) failed: RateLimitError`).FindStringSubmatch(out)
	refused := regexp.MustCompile(`(?m)^(t1-[a-z2-7]{26}) answered: \(refused: `).FindStringSubmatch(out)
	if limited == nil || refused == nil {
		t.Fatalf("worker.py did not print a rate-limited and a refused ticket:\n%s", out)
	}
	rate, ref := limited[1], refused[1]
	if !strings.Contains(out, rate+" retry 1, attempt 2: Echo: ") {
		t.Fatalf("retries.py did not take %s's retry and get an answer:\n%s", rate, out)
	}
	m := regexp.MustCompile(`Operator console: (http://\S+)\s+\(user demo, password (\S+);`).FindSubmatch(demo)
	if m == nil {
		t.Fatalf("demo --serve printed no console address and password:\n%s", demo)
	}
	person := newHTTPPerson(t, string(m[1]))
	person.login("demo", string(m[2]))
	if !waitFor(30*time.Second, func() bool {
		_, page := person.get("/review")
		return strings.Contains(page, ref) && strings.Contains(page, "MODEL_REFUSAL")
	}) {
		_, page := person.get("/review")
		t.Fatalf("the demo console's review queue does not show %s as MODEL_REFUSAL:\n%s", ref, page)
	}
	if !waitFor(30*time.Second, func() bool {
		_, page := person.get("/task?id=" + rate)
		return strings.Contains(page, "RATE_LIMITED") && strings.Contains(page, "SUCCEEDED")
	}) {
		_, page := person.get("/task?id=" + rate)
		t.Fatalf("the demo console's timeline of %s does not show the 429 and the success:\n%s", rate, page)
	}
}
