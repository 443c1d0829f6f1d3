package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
)

// chromium is Debian's browser; integration/test.sh installs it.
const chromium = "/usr/bin/chromium"

// consoleProc is a running `faultrouter console`.
type consoleProc struct {
	url  string
	logs *lockedbuf.Buffer
}

// startConsole starts `faultrouter console` with a users file and waits
// until it answers.
func (e *env) startConsole(users string, extra ...string) *consoleProc {
	e.t.Helper()
	dir := e.t.TempDir()
	usersFile := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(usersFile, []byte(users), 0o600); err != nil {
		e.t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(e.t))
	args := append([]string{"console", "--listen", addr, "--users", usersFile, "--state-dir", filepath.Join(dir, "view")}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Env = e.cmdEnv()
	logs := &lockedbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	e.t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	c := &consoleProc{url: "http://" + addr, logs: logs}
	if !waitFor(30*time.Second, func() bool { return httpOK(c.url + "/healthz") }) {
		e.t.Fatalf("console did not answer; logs:\n%s", logs.String())
	}
	return c
}

// hashPassword runs `faultrouter console --hash-password`.
func (e *env) hashPassword(pw string) string {
	e.t.Helper()
	return strings.TrimSpace(e.cli(pw+"\n", "console", "--hash-password"))
}

// browser starts headless Chromium with the flags that work in CI and a new
// empty profile; cancel the returned context to close it.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("FAULTROUTER_REQUIRE_BROKER") != "" {
			t.Fatalf("%s is missing: integration/test.sh installs it (apt-get install -y chromium)", chromium)
		}
		t.Skipf("%s is missing: apt-get install -y chromium", chromium)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1366, 900),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", chromium, err)
	}
	return ctx
}

// run runs browser actions with a deadline, failing the test with the
// console's logs on error.
func run(t *testing.T, ctx context.Context, c *consoleProc, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	start := time.Now()
	defer func() { t.Logf("browser: %s (%s)", what, time.Since(start).Round(time.Millisecond)) }()
	if err := chromedp.Do(tctx, actions...); err != nil {
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		html, _ := chromedp.Run(hctx, chromedp.OuterHTML(chromedp.CSS("main")))
		hcancel()
		t.Fatalf("%s: %v\npage:\n%s\nconsole logs:\n%s", what, err, html, c.logs.String())
	}
}

// text returns the text of the first element sel matches.
func text(t *testing.T, ctx context.Context, c *consoleProc, sel string) string {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
	// a page that has just loaded may leave the browser's DOM agent on the
	// document before it for a moment: the node is looked up again
	for try := 0; try < 5 && err != nil && strings.Contains(err.Error(), "No node with given id found"); try++ {
		time.Sleep(100 * time.Millisecond)
		s, err = chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
	}
	if err != nil {
		t.Fatalf("text of %s: %v\nconsole logs:\n%s", sel, err, c.logs.String())
	}
	return s
}

// css is a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// shot saves a PNG of the whole page to FAULTROUTER_SCREENSHOTS (docs/ when
// docs/console.md's screenshots are renewed) or the test's temporary directory.
func shot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	dir := os.Getenv("FAULTROUTER_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), png, 0o644)
	})
}

// flashSays waits, without reloading, until the page's banner says want:
// the banner of the page before a navigation must not count.
func flashSays(want string) chromedp.Action[chromedp.Void] {
	js := `(document.querySelector("#flash") || {textContent: ""}).textContent.includes(` + strconv.Quote(want) + `)`
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for {
			if ok, err := chromedp.Evaluate[bool](js)(ctx, tg); err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the banner never said %q", want)
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

// textUntil reloads url until the text of sel contains want.
func textUntil(url, sel, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for {
			if _, err := chromedp.Navigate(url)(ctx, tg); err != nil {
				return err
			}
			txt, err := chromedp.Text(css(sel))(ctx, tg)
			if err != nil {
				return err
			}
			if strings.Contains(txt, want) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s never showed %q in %s; last: %q", url, want, sel, txt)
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
}

// httpPerson is a person using the console from Go, not a browser.
type httpPerson struct {
	t    *testing.T
	base string
	cl   *http.Client
}

func newHTTPPerson(t *testing.T, base string) *httpPerson {
	jar, _ := cookiejar.New(nil)
	return &httpPerson{t: t, base: base, cl: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// get returns the status and body of a GET.
func (h *httpPerson) get(path string) (int, string) {
	h.t.Helper()
	resp, err := h.cl.Get(h.base + path)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// csrf reads the CSRF token from a page.
func (h *httpPerson) csrf(path string) string {
	h.t.Helper()
	_, body := h.get(path)
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		h.t.Fatalf("no CSRF token on %s:\n%s", path, body)
	}
	return m[1]
}

func (h *httpPerson) post(path string, form url.Values) (int, string) {
	h.t.Helper()
	resp, err := h.cl.PostForm(h.base+path, form)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *httpPerson) login(name, pw string) {
	h.t.Helper()
	code, _ := h.post("/login", url.Values{"csrf": {h.csrf("/login")}, "name": {name}, "password": {pw}})
	if code != http.StatusSeeOther {
		h.t.Fatalf("login of %s: status %d, want 303", name, code)
	}
}

var errorText = regexp.MustCompile(`id="error">([^<]*)<`)

func pageError(body string) string {
	if m := errorText.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}
