package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Guards the operator log's completeness: a what-if run and a raw
// dead-letter download are in it, naming who; and the page's banner after
// an action is worded by the console from what the action did, so a link
// that carries done=... and task=... puts no words in it.
func TestWhatifAndRawDownloadsAreInTheOperatorLog(t *testing.T) {
	users := &Users{Users: []User{{Name: "olga", PasswordBcrypt: string(pwHash()), Roles: []string{RoleOperator}}}}
	base, opts, set := testConsole(t, Config{Users: users})
	dl, _ := set.Name("deadletter")
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hs := []kgo.RecordHeader{{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("empty_key")},
		{Key: codec.HeaderErrorMessage, Value: []byte("bad bytes")}}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: dl, Partition: 0, Key: []byte("t-raw"), Value: []byte("raw-bytes"), Headers: hs}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	olga := newClient(t, base)
	olga.login("olga")
	page := waitFor(t, olga, "/deadletter", func(b string) bool { return strings.Contains(b, "data-id=") })
	i := strings.Index(page, `data-id="`) + len(`data-id="`)
	id := page[i : i+strings.IndexByte(page[i:], '"')]
	if code, body := olga.do(http.MethodGet, "/deadletter/raw?id="+url.QueryEscape(id), nil); code != http.StatusOK || body != "raw-bytes" {
		t.Fatalf("raw download of %s: %d %q", id, code, body)
	}
	if code, body := olga.do(http.MethodPost, "/whatif", url.Values{"csrf": {olga.token("/whatif")}, "policy": {"retry_budget: 2\n"}, "hours": {"1"}}); code != http.StatusOK {
		t.Fatalf("what-if: %d %s", code, pageError(body))
	}
	body := waitFor(t, olga, "/operators", func(b string) bool {
		return strings.Contains(b, ">deadletter_raw<") && strings.Contains(b, ">whatif<")
	})
	if !strings.Contains(body, "downloaded dead letter "+id) {
		t.Errorf("the download's record does not name the record %s", id)
	}

	// a crafted link's words never reach the banner
	_, body = olga.do(http.MethodGet, "/review?done=approve&task="+url.QueryEscape("t-1 failed: call +1-555-0100 to restore access"), nil)
	if strings.Contains(body, "555-0100") {
		t.Errorf("the banner shows text from the URL")
	}
}

// Guards an action whose operator log record cannot be written: it is
// refused, says so, and does nothing (here a breaker reset, whose control
// message is not sent).
func TestAnActionIsRefusedWhenItsLogRecordCannotBeWritten(t *testing.T) {
	users := &Users{Users: []User{{Name: "olga", PasswordBcrypt: string(pwHash()), Roles: []string{RoleOperator}}}}
	base, opts, set := testConsole(t, Config{Users: users})
	olga := newClient(t, base)
	olga.login("olga")
	tok := olga.token("/breakers")
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic := (&Server{cfg: Config{Topics: set}}).consoleTopic()
	if _, err := kadm.NewClient(cl).DeleteTopics(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	decisions, _ := set.Name("decisions")
	before := countRecords(t, opts, decisions)
	code, body := olga.do(http.MethodPost, "/breakers/reset", url.Values{"csrf": {tok}, "scope": {"PROMPT_TEMPLATE"}, "key": {"ship-v2"}, "reason": {"template fixed"}})
	if code != http.StatusServiceUnavailable || !strings.Contains(pageError(body), "operator log") {
		t.Errorf("a reset without its log record: %d %q, want 503 saying the operator log record could not be written", code, pageError(body))
	}
	if n := countRecords(t, opts, decisions); n != before {
		t.Errorf("the reset was sent anyway: %d records on the decisions topic, %d before", n, before)
	}
}

// consoleTopicOf creates the console topic of set with parts partitions.
func consoleTopicOf(t *testing.T, opts []kgo.Opt, set interface {
	Name(topicspec.Short) (string, error)
}, parts int32) string {
	t.Helper()
	state, _ := set.Name("state")
	topic := strings.TrimSuffix(state, "faultrouter.state") + "faultrouter.console"
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), parts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	return topic
}

// Guards claims across replicas on a console topic of several partitions:
// two reviewers claiming one item at once on two replicas get one holder,
// the same on both replicas (a claim is keyed by its task, so every claim
// of a task is in one partition, in one order).
func TestTwoReplicasOneClaim(t *testing.T) {
	opts, set := testCluster(t)
	topic := consoleTopicOf(t, opts, set, 4)
	cfg := Config{Users: claimUsers(t), Secret: []byte(strings.Repeat("k", 32))}
	one, _ := startConsole(t, opts, set, cfg)
	two, _ := startConsole(t, opts, set, cfg)
	for round := 0; round < 5; round++ {
		task := []string{"t-1", "t-3"}[round%2]
		alice, bob := newClient(t, one), newClient(t, two)
		alice.login("alice")
		bob.login("bob")
		waitQueue(t, alice, task)
		waitQueue(t, bob, task)
		ta, tb := alice.token("/review"), bob.token("/review")
		codes := make(chan int, 2)
		go func() {
			code, _ := alice.do(http.MethodPost, "/review/claim", url.Values{"csrf": {ta}, "task": {task}, "op": {"claim"}})
			codes <- code
		}()
		go func() {
			code, _ := bob.do(http.MethodPost, "/review/claim", url.Values{"csrf": {tb}, "task": {task}, "op": {"claim"}})
			codes <- code
		}()
		c1, c2 := <-codes, <-codes
		if (c1 == http.StatusSeeOther) == (c2 == http.StatusSeeOther) {
			t.Fatalf("round %d: claims on %s answered %d and %d, want exactly one 303", round, task, c1, c2)
		}
		h1, h2 := holderOn(t, alice, "alice", task), holderOn(t, bob, "bob", task)
		if h1 == "" || h1 != h2 {
			t.Fatalf("round %d: replica one says %q holds %s, replica two %q", round, h1, task, h2)
		}
		// the holder lets go for the next round
		holder := map[string]*client{"alice": alice, "bob": bob}[h1]
		if code, body := holder.do(http.MethodPost, "/review/claim", url.Values{"csrf": {holder.token("/review")}, "task": {task}, "op": {"release"}}); code != http.StatusSeeOther {
			t.Fatalf("release: %d %s", code, pageError(body))
		}
	}
	// every claim and release of a task sits in one partition: whatever
	// order a replica reads the partitions in, it applies a task's claims
	// in the order they were written
	parts := map[string]map[int32]bool{}
	for _, r := range readAll(t, opts, topic) {
		var a opAction
		if json.Unmarshal(r.Value, &a) == nil && (a.Action == actClaim || a.Action == actRelease) && len(a.Tasks) == 1 {
			if parts[a.Tasks[0]] == nil {
				parts[a.Tasks[0]] = map[int32]bool{}
			}
			parts[a.Tasks[0]][r.Partition] = true
		}
	}
	for task, ps := range parts {
		if len(ps) != 1 {
			t.Errorf("the claims of %s sit in partitions %v of the console topic, want one", task, ps)
		}
	}
	if len(parts) != 2 {
		t.Errorf("claims of %d tasks on the console topic, want 2", len(parts))
	}
}

// holderOn is who the queue row of task, seen by me, says holds it, ""
// for nobody.
func holderOn(t *testing.T, c *client, me, task string) string {
	t.Helper()
	_, body := c.do(http.MethodGet, "/review", nil)
	row := queueRow(body, task)
	if strings.Contains(row, "claimed by you") {
		return me
	}
	for _, n := range []string{"alice", "bob"} {
		if strings.Contains(row, "held by <b>"+n+"</b>") {
			return n
		}
	}
	return ""
}

// Guards a confirmation posted to two replicas at once: one of them acts,
// the other refuses, so the previewed bulk decision is sent once.
func TestOneConfirmationPostedToTwoReplicas(t *testing.T) {
	opts, set := testCluster(t)
	consoleTopicOf(t, opts, set, 3)
	cfg := Config{Users: claimUsers(t), Secret: []byte(strings.Repeat("k", 32))}
	one, _ := startConsole(t, opts, set, cfg)
	two, _ := startConsole(t, opts, set, cfg)
	alice := newClient(t, one)
	alice.login("alice")
	// the same browser's cookies on the second replica (the replicas share the secret)
	other := newClient(t, two)
	u, _ := url.Parse(one)
	u2, _ := url.Parse(two)
	other.hc.Jar.SetCookies(u2, alice.hc.Jar.Cookies(u))
	decisions, _ := set.Name("decisions")
	for round := 1; round <= 3; round++ {
		owner := fmt.Sprintf("batch-%d", round)
		a, b := owner+"-a", owner+"-b"
		produceItem(t, opts, set, a, "ai_product")
		produceItem(t, opts, set, b, "ai_product")
		waitQueue(t, alice, a, b)
		waitQueue(t, other, a, b)
		before := countRecords(t, opts, decisions)
		_, preview := alice.do(http.MethodPost, "/review/bulk", url.Values{"csrf": {alice.token("/review")}, "owner": {"ai_product"}, "action": {"approve"}, "reason": {"batch fine"}})
		form := confirmation(t, preview, "/review/bulk", url.Values{"action": {"approve"}})
		n := len(form["task"])
		codes := make(chan int, 2)
		for _, c := range []*client{alice, other} {
			go func() {
				code, _ := c.do(http.MethodPost, "/review/bulk", form)
				codes <- code
			}()
		}
		c1, c2 := <-codes, <-codes
		if (c1 == http.StatusSeeOther) == (c2 == http.StatusSeeOther) {
			t.Errorf("round %d: one confirmation on two replicas answered %d and %d, want one 303 and one refusal", round, c1, c2)
		}
		eventually(func() bool { return countRecords(t, opts, decisions)-before >= n })
		time.Sleep(500 * time.Millisecond) // a second sender's records would be written by now
		if got := countRecords(t, opts, decisions) - before; got != n {
			t.Errorf("round %d: %d decision records for the %d previewed items, want %d", round, got, n, n)
		}
	}
}

// Guards the console topic's partition count: a record written when the
// topic had another count (partitions were added since) stops the console
// at start with one error naming the topic, both counts and the way out.
func TestConsoleTopicPartitionCountIsChecked(t *testing.T) {
	opts, set := testCluster(t)
	topic := consoleTopicOf(t, opts, set, 2)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: topic, Value: []byte(`{"kind":"action","action":"claim","user":"alice","at":"` + time.Now().Format(time.RFC3339) + `","tasks":["t-1"],"holder":"alice","parts":1}`)}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Users: claimUsers(t), Listen: "127.0.0.1:0", StateDir: t.TempDir(), Kafka: opts, Topics: set}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Run(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), topic) || !strings.Contains(err.Error(), "has 2 partitions") || !strings.Contains(err.Error(), "it had 1") ||
		!strings.Contains(err.Error(), "--console-topic") {
		t.Errorf("start with a record of another partition count: %v; want one error naming the topic, 2 and 1 partitions, and --console-topic", err)
	}
}
