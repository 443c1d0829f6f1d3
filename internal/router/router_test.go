package router

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// newTestRouter starts a Router, built through New as main builds it, on an
// embedded kfake broker with the topics of topics/ (one partition each), and
// returns its metrics registry with its topics and the broker's seed options.
func newTestRouter(t testing.TB) (*prometheus.Registry, Topics, []kgo.Opt) {
	return newTestRouterWith(t, nil)
}

// newTestRouterWith is newTestRouter with a hook that adjusts the Config.
func newTestRouterWith(t testing.TB, adjust func(*Config)) (*prometheus.Registry, Topics, []kgo.Opt) {
	t.Helper()
	_, reg, topics, seeds := newTestRouterCluster(t, adjust)
	return reg, topics, seeds
}

// newTestRouterCluster is newTestRouterWith that also returns the embedded
// broker, for tests that inject faults into its requests.
func newTestRouterCluster(t testing.TB, adjust func(*Config)) (*kfake.Cluster, *prometheus.Registry, Topics, []kgo.Opt) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	seeds := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}
	set, err := topicspec.Load("")
	if err != nil {
		t.Fatal(err)
	}
	set = set.WithPartitions(1)
	adm, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := set.Apply(ctx, kadm.NewClient(adm)); err != nil {
		t.Fatalf("create topics: %v", err)
	}
	name := func(short topicspec.Short) string {
		n, err := set.Name(short)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	topics := Topics{
		Ingress: name("ingress"), Decisions: name("decisions"), Retry: name("retry"), Review: name("review"),
		Audit: name("audit"), DeadLetter: name("deadletter"), Alerts: name("alerts"), State: name("state"),
	}
	cfg := Default()
	cfg.ClientOpts = seeds
	cfg.Topics = topics
	cfg.StateDir = t.TempDir()
	cfg.InstanceID = "test"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if adjust != nil {
		adjust(&cfg)
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cluster, reg, topics, seeds
}

// testClient is a client on the test broker that produces to produceTo and
// reads the committed records of the consumed topics from their start.
func testClient(t *testing.T, seeds []kgo.Opt, produceTo string, consume ...string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(seeds,
		kgo.DefaultProduceTopic(produceTo),
		kgo.ConsumeTopics(consume...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// metricValue returns the value of the counter or gauge name{label=value} in
// reg, and whether it exists.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue(), true // the one it is
				}
			}
		}
	}
	return 0, false
}

// Guards the pipeline contract "bad bytes go to dead letter with the error,
// never stop the router" without a real broker: a poison record followed by a
// valid one yields the poison's original bytes on the dead-letter topic with
// its faultrouter.error.* headers, one audit record per input
// (INVALID_INPUT/DEADLETTER, then SUCCEEDED/COMPLETE), and a count in the
// deadlettered-input metric.
func TestPoisonThenValidOnKfake(t *testing.T) {
	reg, topics, seeds := newTestRouter(t)
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	valid, conf := true, 0.95
	ev := event.TaskEvent{
		EventID: "e-1", TaskID: "t-ok", Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf},
	}
	good, err := c.EncodeTaskEvent(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	poison := []byte("\x00\x01 not avro")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.DeadLetter)
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Key: []byte("t-bad"), Value: poison},
		&kgo.Record{Key: []byte("t-ok"), Value: good},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}

	audit, dead := collectAuditAndDead(ctx, t, cl, topics.Audit, 2, 1)

	if len(dead) != 1 {
		t.Fatalf("%d dead-letter records, want 1", len(dead))
	}
	if !bytes.Equal(dead[0].Value, poison) || string(dead[0].Key) != "t-bad" {
		t.Errorf("dead letter carries key %q value %q, want the original t-bad %q", dead[0].Key, dead[0].Value, poison)
	}
	hdr := map[string]string{}
	for _, h := range dead[0].Headers {
		hdr[h.Key] = string(h.Value)
	}
	for k, want := range map[string]string{
		codec.HeaderErrorTopic: topics.Ingress, codec.HeaderErrorPartition: "0", codec.HeaderErrorOffset: "0",
		codec.HeaderErrorStage: "decode", codec.HeaderErrorKind: "not_single_object",
	} {
		if hdr[k] != want {
			t.Errorf("dead-letter header %s = %q, want %q", k, hdr[k], want)
		}
	}
	if hdr[codec.HeaderErrorTimestamp] == "" || hdr[codec.HeaderErrorMessage] == "" {
		t.Errorf("dead-letter headers lack timestamp or message: %v", hdr)
	}

	if len(audit) != 2 {
		t.Fatalf("%d audit records, want 2 (one per input)", len(audit))
	}
	for i, want := range []struct {
		offset int64
		class  event.Class
		route  event.Route
	}{
		{0, event.ClassInvalidInput, event.RouteDeadLetter},
		{1, event.ClassSucceeded, event.RouteComplete},
	} {
		r, err := c.DecodeRouted(audit[i].Value)
		if err != nil {
			t.Fatalf("audit %d: %v", i, err)
		}
		if r.Input.Offset != want.offset || r.Decision.Class != want.class || r.Decision.Route != want.route {
			t.Errorf("audit %d: input offset %d %s/%s, want offset %d %s/%s",
				i, r.Input.Offset, r.Decision.Class, r.Decision.Route, want.offset, want.class, want.route)
		}
	}

	// counters move right after the commit that made the records visible
	const metric = "faultrouter_deadlettered_input_total"
	var (
		got float64
		ok  bool
	)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, ok = metricValue(t, reg, metric, "kind", "not_single_object"); ok && got >= 1 {
			break
		}
	}
	if !ok || got != 1 {
		t.Errorf("%s{kind=not_single_object} = %v (present %v), want 1", metric, got, ok)
	}
}

// Guards the record time of routed output: the dead-letter and audit records
// of one decision carry the decision's time (decided_at), not the moment each
// was produced, so a timeline orders them by the data path. The router's
// clock is set apart from the wall clock; without the rule the records would
// carry the producer's wall-clock time.
func TestOutputRecordsCarryDecisionTime(t *testing.T) {
	decided := time.Date(2031, 3, 4, 5, 6, 7, 8_000_000, time.UTC)
	_, topics, seeds := newTestRouterWith(t, func(cfg *Config) { cfg.Now = func() time.Time { return decided } })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.DeadLetter)
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("t-bad"), Value: []byte("not avro")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for len(got) < 2 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("timed out; records seen: %v", got)
		}
		fetches.EachRecord(func(r *kgo.Record) { got[r.Topic] = r.Timestamp })
	}
	for topic, ts := range got {
		if !ts.Equal(decided) {
			t.Errorf("%s record time %s, want the decision's %s", topic, ts.UTC().Format(time.RFC3339Nano), decided.Format(time.RFC3339Nano))
		}
	}
}

// collectAuditAndDead polls cl, which consumes the audit and dead-letter
// topics, until it has at least nAudit records of audit and nDead of the
// other, and returns them.
func collectAuditAndDead(ctx context.Context, t *testing.T, cl *kgo.Client, audit string, nAudit, nDead int) (a, d []*kgo.Record) {
	t.Helper()
	for len(a) < nAudit || len(d) < nDead {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("timed out: %d audit and %d dead-letter records, want %d and %d", len(a), len(d), nAudit, nDead)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Topic == audit {
				a = append(a, r)
			} else {
				d = append(d, r)
			}
		})
	}
	return a, d
}

// The record batches the router writes use the codec of --compression:
// none by default, the one named otherwise (the batch attributes a reader
// sees). A bad name is refused by New, naming the field and the values.
// (franz-go writes a batch that a codec does not shrink uncompressed: the
// codecs checked are those that shrink the one record this test routes.)
func TestOutputBatchesUseTheConfiguredCompression(t *testing.T) {
	for _, c := range []struct {
		name string
		want uint8 // kgo.RecordAttrs.CompressionType
	}{{"", 0}, {"none", 0}, {"zstd", 4}, {"gzip", 1}} {
		t.Run("compression="+c.name, func(t *testing.T) {
			_, topics, seeds := newTestRouterWith(t, func(cfg *Config) {
				if c.name != "" {
					cfg.Compression = c.name
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.DeadLetter)
			if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("t-bad"), Value: []byte("not avro")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			a, d := collectAuditAndDead(ctx, t, cl, topics.Audit, 1, 1)
			for _, r := range append(a, d...) {
				if got := r.Attrs.CompressionType(); got != c.want {
					t.Errorf("%s record in a batch of compression type %d, want %d", r.Topic, got, c.want)
				}
			}
		})
	}
	cfg := Default()
	cfg.ClientOpts, cfg.StateDir, cfg.Compression = []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, t.TempDir(), "brotli"
	cfg.Topics = Topics{Ingress: "i", Decisions: "d", Retry: "r", Review: "v", Audit: "a", DeadLetter: "x", Alerts: "l", State: "s"}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), `Compression: "brotli" is not one of none, snappy, lz4, zstd, gzip`) {
		t.Errorf("New with compression brotli: %v; want an error naming the field and the values", err)
	}
}
