package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Guards the CLI contract of `topics apply` and `topics check`: apply prints
// each created topic, then "all N topics exist"; check prints "ok: N topics
// match topics/" or fails listing each problem.
func TestTopicsCommand(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set, err := topicspec.Load("")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := topicsCommand(ctx, adm, set, args, &out)
		return out.String(), err
	}
	out, err := run("check")
	if err == nil || !strings.Contains(err.Error(), "topic ai.tasks.ingress does not exist") {
		t.Errorf("check on empty cluster: %q, %v", out, err)
	}
	out, err = run("apply")
	if err != nil || strings.Count(out, "created ") != 9 || !strings.Contains(out, "created faultrouter.state\n") {
		t.Errorf("apply: %q, %v", out, err)
	}
	out, err = run("apply")
	if err != nil || out != "all 9 topics exist\n" {
		t.Errorf("second apply: %q, %v", out, err)
	}
	out, err = run("check")
	if err != nil || out != "ok: 9 topics match topics/\n" {
		t.Errorf("check: %q, %v", out, err)
	}
	out, err = run("check", "--partitions", "12")
	if err == nil || !strings.Contains(err.Error(), "topic ai.tasks.ingress has 6 partitions, the spec wants 12") {
		t.Errorf("check --partitions 12: %q, %v", out, err)
	}
	t.Log(err)
	for _, args := range [][]string{{}, {"verify"}, {"check", "--partitions", "0x"}, {"check", "extra"}, {"apply", "--replication-factor", "-1"}} {
		if _, err := run(args...); err == nil {
			t.Errorf("topics %v: no error", args)
		} else {
			t.Logf("topics %v: %v", args, err)
		}
	}
}
