package topicspec

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newAdmin starts a one-broker kfake cluster and returns an admin client for it.
func newAdmin(t *testing.T) *kadm.Client {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Guards `topics apply` and the start-up of `run`: on an empty cluster Apply
// creates every topic with its configs, Check then finds nothing, and a second
// Apply creates nothing.
func TestApplyCreatesAllThenCheckPasses(t *testing.T) {
	ctx, adm := testContext(t), newAdmin(t)
	s, err := Load("t.")
	if err != nil {
		t.Fatal(err)
	}
	created, err := s.Apply(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(created, s.Names()) {
		t.Errorf("Apply created %v, want %v", created, s.Names())
	}
	problems, err := s.Check(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 0 {
		t.Errorf("Check after Apply = %v, want no problems", problems)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, "t.faultrouter.state")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := rcs.On("t.faultrouter.state", nil); err != nil || !hasConfig(c, "cleanup.policy", "compact") {
		t.Errorf("state topic configs = %+v, %v; want cleanup.policy=compact", c.Configs, err)
	}
	again, err := s.Apply(ctx, adm)
	if err != nil || len(again) != 0 {
		t.Errorf("second Apply = %v, %v; want nothing created", again, err)
	}
	if err := s.Ensure(ctx, adm, nil); err != nil {
		t.Errorf("Ensure on a matching cluster = %v", err)
	}
}

// Guards `topics check` on an empty cluster: every topic is reported missing.
func TestCheckReportsMissingTopics(t *testing.T) {
	ctx, adm := testContext(t), newAdmin(t)
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	problems, err := s.Check(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != len(s.Names()) {
		t.Fatalf("Check = %v, want one missing-topic problem per topic", problems)
	}
	for _, p := range problems {
		if p.Field != FieldExists {
			t.Errorf("problem %v, want Field %q", p, FieldExists)
		}
	}
}

// Guards `run` refusing to start when decisions is not co-partitioned with
// ingress and state: Apply leaves the existing topic alone, Check reports the
// partition mismatch and the co-partitioning violation, and Ensure fails with
// one error naming both.
func TestCheckReportsPartitionMismatchAndCoPartitioning(t *testing.T) {
	ctx, adm := testContext(t), newAdmin(t)
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, "ai.tasks.review.decisions"); err != nil {
		t.Fatal(err)
	}
	// The pre-existing topic lacks the spec's retention.ms; set it so that the
	// only problems left are about partitions.
	alter := []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("2592000000")}}
	if _, err := adm.AlterTopicConfigs(ctx, alter, "ai.tasks.review.decisions"); err != nil {
		t.Fatal(err)
	}
	created, err := s.Apply(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(created, "ai.tasks.review.decisions") || len(created) != len(s.Names())-1 {
		t.Errorf("Apply created %v, want every topic but decisions", created)
	}
	problems, err := s.Check(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	want := []Problem{
		{Topic: "ai.tasks.review.decisions", Field: FieldPartitions, Want: "6", Got: "3"},
		{Topic: "ai.tasks.ingress, ai.tasks.review.decisions, faultrouter.state", Field: FieldCoPartitioning,
			Want: "equal partition counts", Got: "ai.tasks.ingress=6, ai.tasks.review.decisions=3, faultrouter.state=6"},
	}
	if !slices.Equal(problems, want) {
		t.Fatalf("Check = %#v\nwant %#v", problems, want)
	}
	err = s.Ensure(ctx, adm, nil)
	var ce *CheckError
	if !errors.As(err, &ce) || !errors.Is(err, ErrMismatch) || !slices.Equal(ce.Problems, want[1:]) {
		t.Fatalf("Ensure = %v, want a *CheckError with the co-partitioning problem alone (an existing topic keeps its partition count)", err)
	}
	if !strings.Contains(err.Error(), want[1].Error()) {
		t.Errorf("Ensure error does not name the co-partitioning problem %q:\n%s", want[1], err)
	}
}

// Guards `run` refusing to start when a topic's config contradicts the spec:
// a state changelog switched to cleanup.policy=delete is reported.
func TestCheckReportsContradictingConfig(t *testing.T) {
	ctx, adm := testContext(t), newAdmin(t)
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, adm); err != nil {
		t.Fatal(err)
	}
	alter := []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")}}
	if _, err := adm.AlterTopicConfigs(ctx, alter, "faultrouter.state"); err != nil {
		t.Fatal(err)
	}
	problems, err := s.Check(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	want := []Problem{{Topic: "faultrouter.state", Field: "cleanup.policy", Want: "compact", Got: "delete"}}
	if !slices.Equal(problems, want) {
		t.Fatalf("Check = %#v\nwant %#v", problems, want)
	}
	if err := s.Ensure(ctx, adm, nil); !errors.Is(err, ErrMismatch) {
		t.Errorf("Ensure = %v, want ErrMismatch", err)
	}
}

// Guards the replication-factor override: a set asking for more replicas than
// the cluster has brokers fails to apply with an error naming the topic.
func TestApplyReportsCreateFailure(t *testing.T) {
	ctx, adm := testContext(t), newAdmin(t)
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.WithReplicationFactor(3).Apply(ctx, adm)
	if err == nil || !strings.Contains(err.Error(), "ai.tasks.ingress") {
		t.Errorf("Apply with rf 3 on one broker = %v, want an error naming ai.tasks.ingress", err)
	}
}

func hasConfig(rc kadm.ResourceConfig, key, value string) bool {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil && *c.Value == value {
			return true
		}
	}
	return false
}

// Guards the start-up of `run` right after `topics apply`: the topics exist
// (CreateTopics answers TOPIC_ALREADY_EXISTS) but the metadata the router
// reads has not caught up yet (the state topic is unknown for a few
// requests). Ensure waits for the topic to appear instead of refusing to
// start with "topic faultrouter.state does not exist".
func TestEnsureWaitsForAppliedTopicsInMetadata(t *testing.T) {
	ctx := testContext(t)
	c, s := newClusterAndSet(t)
	// `topics apply`, by another process
	applyCl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, kadm.NewClient(applyCl)); err != nil {
		t.Fatal(err)
	}
	applyCl.Close()

	// from now on, the first 4 metadata requests naming the state topic do
	// not see it: the broker answering them lags the topic's creation
	var hidden atomic.Int32
	c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.MetadataRequest)
		if hidden.Load() >= 4 {
			return nil, nil, false
		}
		for i, tp := range req.Topics {
			if tp.Topic != nil && *tp.Topic == "faultrouter.state" {
				// answered as unknown (UNKNOWN_TOPIC_OR_PARTITION), as a
				// broker whose metadata lags answers
				hidden.Add(1)
				req.Topics[i].Topic = kmsg.StringPtr("faultrouter.state.not-yet-known")
			}
		}
		return nil, nil, false
	})

	ensureWaits(ctx, t, c, s, "the metadata lags it")
	if hidden.Load() < 4 {
		t.Fatalf("the state topic was hidden from %d metadata requests, want 4: the test did not exercise the lag", hidden.Load())
	}
}

// Guards the start-up of `run` on a cluster of several brokers: the broker
// answering the metadata knows the just-created state topic, the broker
// answering DescribeConfigs does not yet and says UNKNOWN_TOPIC_OR_PARTITION.
// Ensure waits for it instead of refusing to start.
func TestEnsureWaitsForTopicConfigsToPropagate(t *testing.T) {
	ctx := testContext(t)
	c, s := newClusterAndSet(t)
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.DescribeConfigs), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.DescribeConfigsRequest)
		if refused.Load() >= 3 {
			return nil, nil, false
		}
		state := false
		for _, r := range req.Resources {
			state = state || r.ResourceName == "faultrouter.state"
		}
		if !state {
			return nil, nil, false
		}
		refused.Add(1)
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, r := range req.Resources {
			rr := kmsg.NewDescribeConfigsResponseResource()
			rr.ResourceType = r.ResourceType
			rr.ResourceName = r.ResourceName
			rr.ErrorCode = kerr.UnknownTopicOrPartition.Code
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
	ensureWaits(ctx, t, c, s, "DescribeConfigs lags it")
	if refused.Load() < 3 {
		t.Fatalf("DescribeConfigs refused %d times, want 3: the test did not exercise the lag", refused.Load())
	}
}

// newClusterAndSet starts a one-broker kfake cluster and loads the default
// topic set.
func newClusterAndSet(t *testing.T) (*kfake.Cluster, Set) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// ensureWaits runs Ensure of s on cluster c, where the state topic's
// creation reaches some answers late (lag says which), and checks that it
// waited for the topic, with a log line naming it, instead of failing.
func ensureWaits(ctx context.Context, t *testing.T, c *kfake.Cluster, s Set, lag string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	var logs bytes.Buffer
	if err := s.Ensure(ctx, kadm.NewClient(cl), slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatalf("Ensure while %s = %v, want it to wait", lag, err)
	}
	if !strings.Contains(logs.String(), "faultrouter.state") || !strings.Contains(logs.String(), "waiting") {
		t.Errorf("Ensure waited without a log line naming the topic; logs:\n%s", logs.String())
	}
}
