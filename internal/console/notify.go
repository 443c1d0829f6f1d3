package console

// notify.go: webhooks per owner. A review item that opens with high
// priority, and an open item past its owner's SLA, are posted to the
// owner's webhook (Slack-compatible JSON: "text", and the same text as one
// mrkdwn block) once per opening of the item.
//
// Delivery runs beside the console, never in its way: each owner's webhook
// has its own bounded queue and one sender, so a receiver that never
// answers delays only its own owner's notices, and a full queue defers a
// notice to the next scan rather than blocking the ingest or a page. An
// attempt is bounded by Webhooks.Timeout; a failure (network, timeout, 429,
// 5xx) is retried Attempts times in all with a doubling backoff; another
// 4xx is final. Redirects are followed only on the webhook's own scheme and
// host. Only http and https URLs are accepted.
//
// Every delivery, delivered or failed, is a "notify" action on the console
// topic: it shows in the operator log and on the task's timeline, and it
// marks the notice sent, so a restarted console (or a rebuilt view) does not
// send it again. faultrouter_console_webhook_deliveries_total counts the
// outcomes. Replicas with the same webhooks send each notice once: before
// sending, a replica takes the notice's lease on the console topic (as a
// claim, the first record wins), and only the holder sends.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// Webhooks is the owners' notification config (the --webhooks YAML file).
type Webhooks struct {
	// Owners maps a policy owner (ai_product, security...) to its webhook
	// URL; "*" is the webhook of every owner without its own.
	Owners map[string]string `yaml:"owners"`
	// Timeout bounds one attempt (5s when zero).
	Timeout time.Duration `yaml:"timeout"`
	// Attempts is the number of tries of one notice (5 when zero).
	Attempts int `yaml:"attempts"`
	// Backoff is the wait after the first failed try, doubled after each
	// next one up to a minute (1s when zero).
	Backoff time.Duration `yaml:"backoff"`
	// Check is how often open items are scanned for notices (30s when
	// zero).
	Check time.Duration `yaml:"check"`
	// Window: an item opened, or past its SLA, longer ago than this is not
	// notified (24h when zero); it bounds what a first start sends.
	Window time.Duration `yaml:"window"`
	// QueueSize bounds the notices waiting per owner (100 when zero).
	QueueSize int `yaml:"queue_size"`
}

// LoadWebhooks reads and checks a webhooks file.
func LoadWebhooks(path string) (*Webhooks, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("console: webhooks file: %w", err)
	}
	var w Webhooks
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("console: webhooks file %s: %w", path, err)
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return &w, nil
}

// Validate checks every URL (http or https, with a host) and fills the
// defaults.
func (w *Webhooks) Validate() error {
	if len(w.Owners) == 0 {
		return errors.New("console: webhooks.owners: at least one owner and its URL, e.g. ai_product: https://hooks.slack.com/services/...")
	}
	for owner, raw := range w.Owners {
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			return fmt.Errorf("console: webhooks.owners.%s: not a URL: %v", owner, err)
		case u.Scheme != "http" && u.Scheme != "https":
			return fmt.Errorf("console: webhooks.owners.%s: scheme %q: allowed http, https", owner, u.Scheme)
		case u.Host == "":
			return fmt.Errorf("console: webhooks.owners.%s: the URL names no host", owner)
		}
	}
	switch {
	case w.Timeout < 0, w.Backoff < 0, w.Check < 0, w.Window < 0:
		return errors.New("console: webhooks: timeout, backoff, check and window may not be negative")
	case w.Attempts < 0 || w.Attempts > 20:
		return fmt.Errorf("console: webhooks.attempts %d: allowed 1 to 20", w.Attempts)
	case w.QueueSize < 0:
		return fmt.Errorf("console: webhooks.queue_size %d: at least 1", w.QueueSize)
	}
	w.Timeout = cmpOr(w.Timeout, 5*time.Second)
	w.Backoff = cmpOr(w.Backoff, time.Second)
	w.Check = cmpOr(w.Check, 30*time.Second)
	w.Window = cmpOr(w.Window, 24*time.Hour)
	w.Attempts = cmpOr(w.Attempts, 5)
	w.QueueSize = cmpOr(w.QueueSize, 100)
	return nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// url returns the webhook of owner, "" when none.
func (w *Webhooks) url(owner string) (string, string) {
	if u, ok := w.Owners[owner]; ok {
		return owner, u
	}
	return "*", w.Owners["*"]
}

// Notice kinds.
const (
	noticeHigh = "new_high_priority"
	noticeSLA  = "past_sla"
)

// notice is one message to an owner's webhook about an item's opening.
type notice struct {
	Kind   string
	Item   reviewItem
	Owner  string
	Hook   string // the key of Webhooks.Owners
	URL    string
	Queued time.Time
}

// key names the notice once per opening of the item.
func (n *notice) key() string { return noticeKey(n.Kind, n.Item.TaskID, n.Item.OpenedAt) }

func noticeKey(kind, task string, opened time.Time) string {
	return "ntf/" + kind + "/" + task + "/" + timeKey(opened.UnixMilli())
}

// notifier scans the view for notices and sends them.
type notifier struct {
	s   *Server
	cfg *Webhooks
	hc  *http.Client

	mu       sync.Mutex
	queues   map[string]chan notice // per webhook
	inflight map[string]time.Time   // notice key -> queued at
}

func newNotifier(s *Server, cfg *Webhooks) *notifier {
	n := &notifier{s: s, cfg: cfg, queues: map[string]chan notice{}, inflight: map[string]time.Time{}}
	n.hc = &http.Client{Timeout: cfg.Timeout, CheckRedirect: sameHostOnly}
	return n
}

// errOtherHost is returned for a redirect away from the webhook's host.
var errOtherHost = errors.New("redirect to another host or scheme refused")

func sameHostOnly(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return fmt.Errorf("%w: %s", errOtherHost, req.URL.Host)
	}
	if len(via) >= 3 {
		return errors.New("more than 3 redirects")
	}
	return nil
}

// run scans every Check until ctx ends; the senders stop with it.
func (n *notifier) run(ctx context.Context) {
	t := time.NewTicker(n.cfg.Check)
	defer t.Stop()
	for {
		if _, _, caughtUp, _ := n.s.prog.snapshot(); caughtUp {
			if err := n.scan(ctx, time.Now()); err != nil {
				n.s.log.Warn("console: webhooks: scanning the queue", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxNoticeScan bounds the keys one scan reads.
const maxNoticeScan = 20_000

// scan queues the notices due at now: high-priority items marked by the
// ingest (nq/), and open items past their SLA (the queue index up to now).
func (n *notifier) scan(ctx context.Context, now time.Time) error {
	v := n.s.view
	var done []string
	scanned := 0
	err := v.each("nq/", false, func(k string, _ []byte) bool {
		scanned++
		task := strings.TrimPrefix(k, "nq/")
		var it reviewItem
		ok, err := v.get("rev/"+task, &it)
		switch {
		case err != nil || !ok || !it.open() || it.decided() != nil || now.Sub(it.OpenedAt) > n.cfg.Window:
			done = append(done, k)
		default:
			if v.has(noticeKey(noticeHigh, task, it.OpenedAt)) {
				done = append(done, k)
			} else {
				n.queue(ctx, noticeHigh, &it, now)
			}
		}
		return scanned < maxNoticeScan
	})
	if err != nil {
		return err
	}
	for _, k := range done {
		v.db.Delete([]byte(k), nil)
	}
	lo := "q/" + timeKey(now.Add(-n.cfg.Window).UnixMilli())
	hi := "q/" + timeKey(now.UnixMilli())
	return n.s.queueScanRange(lo, hi, func(task string, due time.Time) bool {
		scanned++
		var it reviewItem
		if ok, err := v.get("rev/"+task, &it); err != nil || !ok || !it.open() || it.decided() != nil {
			return scanned < maxNoticeScan
		}
		if !v.has(noticeKey(noticeSLA, task, it.OpenedAt)) {
			n.queue(ctx, noticeSLA, &it, now)
		}
		return scanned < maxNoticeScan
	})
}

// queue hands a notice to its owner's sender unless it is on its way; a
// full queue leaves it for the next scan.
func (n *notifier) queue(ctx context.Context, kind string, it *reviewItem, now time.Time) {
	hook, u := n.cfg.url(it.Owner)
	if u == "" {
		return
	}
	nt := notice{Kind: kind, Item: *it, Owner: it.Owner, Hook: hook, URL: u, Queued: now}
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, at := range n.inflight {
		if now.Sub(at) > n.leaseTTL() {
			delete(n.inflight, k)
		}
	}
	if _, ok := n.inflight[nt.key()]; ok {
		return
	}
	q, ok := n.queues[hook]
	if !ok {
		q = make(chan notice, n.cfg.QueueSize)
		n.queues[hook] = q
		go n.send(ctx, q)
	}
	select {
	case q <- nt:
		n.inflight[nt.key()] = now
	default:
		n.s.met.webhook.WithLabelValues("deferred").Inc()
	}
}

// send delivers the notices of one webhook in order until ctx ends.
func (n *notifier) send(ctx context.Context, q chan notice) {
	for {
		select {
		case <-ctx.Done():
			return
		case nt := <-q:
			n.deliver(ctx, &nt)
		}
	}
}

// deliver tries a notice up to Attempts times and records the outcome,
// unless another replica took it.
func (n *notifier) deliver(ctx context.Context, nt *notice) {
	if !n.lease(ctx, nt) {
		return
	}
	body := slackBody(nt, n.s.cfg.PublicURL)
	wait := n.cfg.Backoff
	var err error
	tries := 0
	for tries < n.cfg.Attempts {
		tries++
		var retry bool
		if retry, err = n.post(ctx, nt.URL, body); err == nil || !retry {
			break
		}
		if tries == n.cfg.Attempts {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
	if ctx.Err() != nil {
		return
	}
	task := nt.Item.TaskID
	a := opAction{Action: "notify", User: "console", Tasks: []string{task}, Notice: nt.Kind, Item: nt.Item.OpenedAt,
		What: fmt.Sprintf("webhook of owner %s (%s): %s delivered after %d attempt(s)", nt.Owner, hostOf(nt.URL), noticeText(nt.Kind), tries)}
	if err != nil {
		a.What = fmt.Sprintf("webhook of owner %s (%s): %s failed after %d attempt(s)", nt.Owner, hostOf(nt.URL), noticeText(nt.Kind), tries)
		a.Why = err.Error()
		n.s.met.webhook.WithLabelValues("failed").Inc()
		n.s.log.Warn("console: webhook failed", "task_id", task, "owner", nt.Owner, "host", hostOf(nt.URL), "notice", nt.Kind, "attempts", tries, "err", err)
	} else {
		n.s.met.webhook.WithLabelValues("delivered").Inc()
		n.s.log.Info("console: webhook delivered", "task_id", task, "owner", nt.Owner, "host", hostOf(nt.URL), "notice", nt.Kind, "attempts", tries)
	}
	n.s.note(a)
}

// lease takes the sending of a notice for this replica: a lease record on
// the console topic, read back; replicas with the same webhooks agree, by
// the topic's order, on the one that sends. A lease ends by itself after
// the longest a delivery can take, so a notice whose sender died is sent by
// another replica then.
func (n *notifier) lease(ctx context.Context, nt *notice) bool {
	s := n.s
	key := nt.key()
	holder := "notifier " + s.instance
	a := opAction{Action: actLease, User: "console", Holder: holder, Tasks: []string{key}, At: time.Now(), Until: time.Now().Add(n.leaseTTL())}
	if err := s.writeAndReadBack(ctx, s.actionRecord(&a), "notice lease"); err != nil {
		s.log.Warn("console: webhook: the notice's lease was not written; it is tried at a later scan", "task_id", nt.Item.TaskID, "err", err)
		n.mu.Lock()
		delete(n.inflight, key)
		n.mu.Unlock()
		return false
	}
	s.mu.Lock()
	c := s.leases[key]
	s.mu.Unlock()
	return c.Holder == holder
}

// leaseTTL is the longest one delivery may take, with a minute to spare.
func (n *notifier) leaseTTL() time.Duration {
	backoff, total := n.cfg.Backoff, time.Minute
	for i := 0; i < n.cfg.Attempts; i++ {
		total += n.cfg.Timeout + backoff
		backoff = min(2*backoff, time.Minute)
	}
	return total
}

// post sends one attempt; retry says whether another may help.
func (n *notifier) post(ctx context.Context, u string, body []byte) (retry bool, err error) {
	n.s.met.webhookAttempts.Inc()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "faultrouter-console")
	resp, err := n.hc.Do(req)
	if err != nil {
		if errors.Is(err, errOtherHost) {
			return false, errors.New("the webhook redirected to another host: refused")
		}
		var ue *url.Error // its text names the URL, whose path is a secret
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return true, fmt.Errorf("the webhook did not answer: %v", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return false, nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return false, fmt.Errorf("the webhook answered %s (a redirect that was not followed)", resp.Status)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("the webhook answered %s", resp.Status)
	default:
		return false, fmt.Errorf("the webhook answered %s; not retried", resp.Status)
	}
}

// hostOf is the host of a webhook URL: the rest (a Slack URL's path is
// its secret) is never logged.
func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Host
	}
	return "?"
}

func noticeText(kind string) string {
	if kind == noticeSLA {
		return "item past its SLA"
	}
	return "new high-priority item"
}

// slackBody is the JSON a Slack incoming webhook (and most chat webhooks)
// takes: text, and the same text as one mrkdwn section block.
func slackBody(nt *notice, publicURL string) []byte {
	it := &nt.Item
	due := it.dueAt().UTC().Format("2006-01-02 15:04 UTC")
	head := "New high-priority review item"
	if nt.Kind == noticeSLA {
		head = "Review item past its SLA"
	}
	text := fmt.Sprintf("*%s* for %s: task `%s`, %s (%s), due %s, priority %s.", head, slackEscape(it.Owner), slackEscape(it.TaskID),
		slackEscape(it.Class), slackEscape(clip(it.Reason, 300)), due, slackEscape(it.Priority))
	if publicURL != "" {
		link := strings.TrimRight(publicURL, "/") + "/task?" + url.Values{"id": {it.TaskID}}.Encode()
		text += " <" + slackEscape(link) + "|Open in the console>"
	}
	b, _ := json.Marshal(map[string]any{"text": text, "blocks": []any{map[string]any{"type": "section",
		"text": map[string]string{"type": "mrkdwn", "text": text}}}})
	return b
}

// slackEscape escapes the three characters Slack reads as markup, so that
// a task ID or reason cannot mention @channel or forge a link.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// applyNotice marks a notice sent when its record is read back.
func applyNotice(b *batch, a *opAction) error {
	if a.Action != "notify" || len(a.Tasks) != 1 || a.Notice == "" {
		return nil
	}
	return b.b.Set([]byte(noticeKey(a.Notice, a.Tasks[0], a.Item)), nil, nil)
}
