package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// coopRouter is a router of the cooperative test, its log captured as JSON.
type coopRouter struct {
	rt    *Router
	logs  *lockedbuf.Buffer
	kafka *lockedbuf.Buffer // its Kafka client's log
	stop  func()
}

// firstSession returns the partitions of topic that the router's first
// group session added, as its Kafka client logged it.
func (c *coopRouter) firstSession(t *testing.T, topic string) []int32 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(c.kafka.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg   string             `json:"msg"`
			Added map[string][]int32 `json:"added"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "new group session begun" {
			return line.Added[topic]
		}
	}
	t.Fatalf("no group session in the Kafka client's log:\n%s", c.kafka.String())
	return nil
}

// revoked returns every partition the router's log says it revoked.
func (c *coopRouter) revoked(t *testing.T) []int32 {
	t.Helper()
	var out []int32
	sc := bufio.NewScanner(strings.NewReader(c.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg        string  `json:"msg"`
			Partitions []int32 `json:"partitions"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "partitions revoked" {
			out = append(out, line.Partitions...)
		}
	}
	return out
}

// Guards decisions through a deploy: in a group of routers (all on the
// cooperative protocol) a member that joins takes its share from the others
// and a member that leaves hands its partitions over, while the others keep
// routing what they keep: no router revokes a partition that stays with it,
// and every event produced across the join and the leave is decided once.
func TestCooperativeRebalanceKeepsWhatStays(t *testing.T) {
	w := lcStart(t, 6)
	start := func(id string) *coopRouter {
		c := &coopRouter{logs: &lockedbuf.Buffer{}, kafka: &lockedbuf.Buffer{}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		cfg := Default()
		cfg.ClientOpts, cfg.Topics, cfg.StateDir, cfg.InstanceID = w.seeds, w.topics, t.TempDir(), id
		cfg.ClientOpts = append(slices.Clip(cfg.ClientOpts), kgo.WithLogger(kslog.New(slog.New(slog.NewJSONHandler(c.kafka, nil)))))
		cfg.Tick = 50 * time.Millisecond
		cfg.GroupProtocol = "cooperative"
		cfg.Logger = slog.New(slog.NewJSONHandler(c.logs, nil))
		rt, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.rt = rt
		go func() { done <- rt.Run(ctx) }()
		c.stop = sync.OnceFunc(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", id, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s: Run did not return within 30 s of its context's end", id)
			}
		})
		t.Cleanup(c.stop)
		return c
	}
	adm := kadm.NewClient(testClient(t, w.seeds, w.topics.Ingress))
	// settled waits until the group is stable with n members on the
	// cooperative protocol and each router given is ready with want
	// partitions
	settled := func(n, want int, rs ...*coopRouter) {
		t.Helper()
		ok := lcWaitFor(60*time.Second, func() bool {
			gs, err := adm.DescribeGroups(context.Background(), Default().Group)
			if err != nil {
				return false
			}
			g := gs[Default().Group]
			if g.State != "Stable" || len(g.Members) != n || g.Protocol != cooperativeProtocol {
				return false
			}
			for _, r := range rs {
				if !r.rt.Ready() || len(r.rt.ownedPartitions()) != want {
					return false
				}
			}
			return true
		})
		if !ok {
			gs, _ := adm.DescribeGroups(context.Background(), Default().Group)
			t.Fatalf("the group did not settle with %d members, %d partitions each, on %s within 60 s: %+v", n, want, cooperativeProtocol, gs[Default().Group])
		}
	}

	a, b := start("a"), start("b")
	settled(2, 3, a, b)
	aHad, bHad := a.rt.ownedPartitions(), b.rt.ownedPartitions()
	aRevoked, bRevoked := len(a.revoked(t)), len(b.revoked(t))

	// events for new tasks all along, each succeeds: one audit record each
	produced := make(chan int, 1)
	stopProducing := make(chan struct{})
	go func() {
		cl := testClient(t, w.seeds, w.topics.Ingress)
		valid, conf := true, 0.9
		n := 0
		defer func() { produced <- n }()
		for {
			select {
			case <-stopProducing:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var recs []*kgo.Record
			for range 10 {
				ev := event.TaskEvent{
					EventID: fmt.Sprintf("e-coop-%d", n), TaskID: fmt.Sprintf("t-coop-%d", n), Attempt: 1, OccurredAt: event.At(time.Now()),
					Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
					Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf},
				}
				v, err := w.codec.EncodeTaskEvent(nil, &ev)
				if err != nil {
					t.Error(err)
					return
				}
				recs = append(recs, &kgo.Record{Key: []byte(ev.TaskID), Value: v})
				n++
			}
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	// c joins: a and b each give up one partition and revoke nothing else
	c := start("c")
	settled(3, 2, a, b, c)
	cGot := c.rt.ownedPartitions()
	// c's first round gives it nothing (its share is revoked first) and
	// says more comes: c starts the second round itself rather than wait
	// for a heartbeat to tell it of the round a and b begin. Its Kafka
	// client quits the heartbeat loop for it ("from ForceRebalance")
	// unless a heartbeat already told it of that round: then the join
	// drains the request, and which came first is the scheduler's choice.
	// If c's first sync failed (RebalanceInProgress: a and b revoked in
	// that round), its first session is the second round, which gives it
	// its whole share at once and has nothing more to come.
	if first := c.firstSession(t, w.topics.Ingress); !slices.Equal(slices.Sorted(slices.Values(first)), cGot) {
		if !strings.Contains(c.logs.String(), "rejoining the group at once") {
			t.Errorf("c joined: it did not rejoin at once for the partitions its first round said were to come\nc's log:\n%s\nc's Kafka client:\n%s", c.logs.String(), c.kafka.String())
		}
		if !strings.Contains(c.kafka.String(), `"why":"from ForceRebalance"`) {
			t.Logf("c joined: a heartbeat told c of the second round before its own rejoin request was taken")
		}
	} else {
		t.Logf("c joined: its first session gave it its whole share %v at once (its first sync came after the revokes)", first)
	}
	for _, r := range []struct {
		name    string
		r       *coopRouter
		had     []int32
		already int
	}{{"a", a, aHad, aRevoked}, {"b", b, bHad, bRevoked}} {
		revoked := r.r.revoked(t)[r.already:]
		for _, p := range revoked {
			if !slices.Contains(cGot, p) {
				t.Errorf("c joined: %s revoked partition %d, which stayed with it or went to another (c got %v; %s revoked %v)", r.name, p, cGot, r.name, revoked)
			}
		}
		for _, p := range r.r.rt.ownedPartitions() {
			if !slices.Contains(r.had, p) {
				t.Errorf("c joined: %s owns %d now, which it did not own before (had %v)", r.name, p, r.had)
			}
		}
	}

	// c leaves: a and b take its partitions and revoke nothing
	aRevoked, bRevoked = len(a.revoked(t)), len(b.revoked(t))
	aKept, bKept := a.rt.ownedPartitions(), b.rt.ownedPartitions()
	c.stop()
	settled(2, 3, a, b)
	if got := a.revoked(t)[aRevoked:]; len(got) > 0 {
		t.Errorf("c left: a revoked %v", got)
	}
	if got := b.revoked(t)[bRevoked:]; len(got) > 0 {
		t.Errorf("c left: b revoked %v", got)
	}
	for _, p := range append(slices.Clone(aKept), bKept...) {
		if !slices.Contains(a.rt.ownedPartitions(), p) && !slices.Contains(b.rt.ownedPartitions(), p) {
			t.Errorf("c left: partition %d, kept by a or b while c was there, is no longer theirs", p)
		}
	}
	time.Sleep(500 * time.Millisecond) // events after the leave, too
	close(stopProducing)
	n := <-produced

	audits := w.routedByTask(w.topics.Audit, 3*time.Second)
	for i := range n {
		id := fmt.Sprintf("t-coop-%d", i)
		if got := len(audits[id]); got != 1 {
			t.Errorf("%s: %d audit records, want exactly 1", id, got)
		}
	}
	if n == 0 {
		t.Fatal("no event produced across the join and the leave")
	}
	t.Logf("%d events across the join and the leave; c got %v", n, cGot)
}
