package router

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/internal/scan"
)

// kfake_faults_test.go: what the kfake fault tests share: the ID of a topic,
// whether a produce request carries records for it, an answer that fails
// every partition of a produce request, and a read of a topic's committed
// records.

// topicID returns the broker's ID of topic (a produce request may name a
// topic by ID instead of by name).
func topicID(t *testing.T, seeds []kgo.Opt, topic string) [16]byte {
	t.Helper()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil || td[topic].Err != nil {
		t.Fatalf("topic %s: %v %v", topic, err, td[topic].Err)
	}
	return [16]byte(td[topic].ID)
}

// producesTo reports whether req carries records for topic (by name or id).
func producesTo(req *kmsg.ProduceRequest, topic string, id [16]byte) bool {
	for _, rt := range req.Topics {
		if rt.Topic == topic || rt.TopicID == id {
			return true
		}
	}
	return false
}

// answerProduce answers every partition of req with the error code that
// code gives for its topic.
func answerProduce(req *kmsg.ProduceRequest, code func(kmsg.ProduceRequestTopic) int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = req.Version
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code(rt)
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// readCommitted calls each with every committed record of topic; an error
// from each fails the test.
func readCommitted(t *testing.T, seeds []kgo.Opt, topic string, each func(*kgo.Record) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topic)
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		for _, r := range b.Records {
			if err := each(r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", topic, err)
	}
}
