package integration

import (
	"context"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// murmur2Partition is the partition Kafka's default partitioner (murmur2)
// picks for key among n.
func murmur2Partition(key string, n int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(key)}, n))
}

// crc32Partitioner is librdkafka's default for keyed records (consistent
// hashing with CRC32), what confluent-kafka clients use unless told
// otherwise.
func crc32Partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		return func(r *kgo.Record, n int) int { return int(crc32.ChecksumIEEE(r.Key) % uint32(n)) }
	})
}

func sumMetric(t *testing.T, sample string, rs ...*router) float64 {
	t.Helper()
	var sum float64
	for _, r := range rs {
		v, _ := scrape(t, r.metrics, sample)
		sum += v
	}
	return sum
}

// Guards "the router does not trust the producer's partitioner": with two
// router instances, a worker and a reviewer whose clients hash keys with
// CRC32 (librdkafka's default) put a task's redelivered event and its review
// approval on another partition than the task's (murmur2). Each is forwarded
// to the task's partition in the router's transaction (audited as
// partition.forward, original bytes plus faultrouter.forwarded.from) and
// routed there: the redelivery is deduplicated (DROP) against the task's
// state, the approval finds the open review item, and nothing is dropped as
// "unknown task". Real default policy, breakers on.
func TestWrongPartitionForwarded(t *testing.T) {
	e := newEnv(t)
	ra := e.startRouter("a", t.TempDir())
	rb := e.startRouter("b", t.TempDir())
	logs := func() string { return "router a:\n" + ra.logs.String() + "\nrouter b:\n" + rb.logs.String() }

	var task string
	for i := 0; task == ""; i++ {
		id := fmt.Sprintf("fw-%d", i)
		if int32(crc32.ChecksumIEEE([]byte(id))%3) != murmur2Partition(id, 3) {
			task = id
		}
	}
	home, wrong := murmur2Partition(task, 3), int32(crc32.ChecksumIEEE([]byte(task))%3)

	refusal := taskEvent("e-1", task, 1, refusalFields)
	e.cli(refusal, "produce", "--topic", "ingress") // the CLI hashes with murmur2, like the Java client
	e.tailUntil("review", 30*time.Second, func(r []map[string]any) bool { return len(byTask(r, task)) == 1 })

	// the same event redelivered, and the approval, by CRC32 clients
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.ParseTaskEventJSON([]byte(refusal))
	if err != nil {
		t.Fatal(err)
	}
	approval := event.ReviewDecision{TaskID: task, Approve: true, Reason: "safe to retry", Reviewer: "ana", At: event.At(time.Now())}
	av, err := c.EncodeReviewDecision(nil, &approval)
	if err != nil {
		t.Fatal(err)
	}
	cl := kafkaClient(t, kgo.RecordPartitioner(crc32Partitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ingress, decisions := e.prefix+"ai.tasks.ingress", e.prefix+"ai.tasks.review.decisions"
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: ingress, Key: []byte(task), Value: encodeEvent(t, c, &ev), Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// the approval after the redelivery has been routed: a person approves
	// what is on the review topic
	in := func(a []map[string]any, topic string, p int32) []map[string]any {
		var out []map[string]any
		for _, x := range a {
			if str(x, "input.topic") == topic && get(x, "input.partition") == float64(p) {
				out = append(out, x)
			}
		}
		return out
	}
	if a := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(in(a, ingress, home)) == 2 }); len(in(a, ingress, home)) != 2 {
		t.Fatalf("the redelivery by a CRC32 client (ingress/%d) was not routed on the task's partition ingress/%d: audit %v\n%s",
			wrong, home, a, logs())
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	if err := cl.ProduceSync(pctx, &kgo.Record{Topic: decisions, Key: []byte(task), Value: av}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	audit := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(in(a, decisions, home)) == 1 })

	check := func(what string, recs []map[string]any, want ...string) {
		t.Helper()
		var got []string
		for _, x := range recs {
			got = append(got, str(x, "decision.route")+"/"+str(x, "decision.rule"))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: audit %v, want %v", what, got, want)
		}
	}
	check(fmt.Sprintf("ingress/%d (the CRC32 partition)", wrong), in(audit, ingress, wrong), "COMPLETE/partition.forward")
	ih := in(audit, ingress, home)
	if len(ih) == 2 {
		check(fmt.Sprintf("ingress/%d (the task's partition)", home), ih[1:], "DROP/dedup.redelivery")
	} else {
		t.Errorf("ingress/%d: %d audit records, want the refusal and the forwarded redelivery", home, len(ih))
	}
	check(fmt.Sprintf("decisions/%d (the CRC32 partition)", wrong), in(audit, decisions, wrong), "COMPLETE/partition.forward")
	dh := in(audit, decisions, home)
	if len(dh) != 1 || str(dh[0], "decision.rule") == "review.no_open_item" || str(dh[0], "decision.route") == "DROP" {
		t.Fatalf("the forwarded approval on decisions/%d was decided %v, want it applied to the open review item\n%s", home, dh, logs())
	}

	// the forwarded copy: the original bytes and headers, plus where it came from
	rc := kafkaClient(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{ingress: {home: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var fwd *kgo.Record
	for fwd == nil && ctx.Err() == nil {
		rc.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "faultrouter.forwarded.from" {
					fwd = r
				}
			}
		})
	}
	if fwd == nil {
		t.Fatal("no record with faultrouter.forwarded.from on the task's ingress partition")
	}
	hdr := map[string]string{}
	for _, h := range fwd.Headers {
		hdr[h.Key] = string(h.Value)
	}
	if !strings.HasPrefix(hdr["faultrouter.forwarded.from"], fmt.Sprintf("%s/%d/", ingress, wrong)) || hdr["traceparent"] == "" ||
		string(fwd.Key) != task || string(fwd.Value) != string(encodeEvent(t, c, &ev)) {
		t.Errorf("forwarded record: key %q headers %v, want the original key, bytes and headers plus faultrouter.forwarded.from", fwd.Key, hdr)
	}
	for sample, want := range map[string]float64{
		`faultrouter_forwarded_total{topic="` + ingress + `"}`:   1,
		`faultrouter_forwarded_total{topic="` + decisions + `"}`: 1,
	} {
		if got := sumMetric(t, sample, ra, rb); got != want {
			t.Errorf("%s summed over both instances = %v, want %v", sample, got, want)
		}
	}
}

// Guards partitions added at runtime: the router reads the partition counts
// (--partition-check), alerts once on the alerts topic (scope TOPIC) and in
// /metrics when ingress grows from 3 to 6 partitions, consumes the new
// partitions, and forwards a task event written to a new partition to the
// task's partition among the original 3, where it is routed: every task keeps
// its partition and its state.
func TestPartitionsAddedAtRuntime(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir(), "--partition-check", "1s")
	ingress := e.prefix + "ai.tasks.ingress"
	adm := kadm.NewClient(kafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := adm.CreatePartitions(ctx, 3, ingress); err != nil {
		t.Fatal(err)
	}
	grown := func(a []map[string]any) bool {
		for _, x := range a {
			if str(x, "scope") == "TOPIC" && str(x, "key") == ingress && str(x, "kind") == "ALERT" {
				return true
			}
		}
		return false
	}
	if a := e.tailUntil("alerts", 30*time.Second, grown); !grown(a) {
		t.Fatalf("no alert for the partitions added to %s: %v\nlogs:\n%s", ingress, a, r.logs.String())
	}

	var task string
	for i := 0; task == ""; i++ {
		if id := fmt.Sprintf("grow-%d", i); murmur2Partition(id, 6) >= 3 {
			task = id
		}
	}
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	// a producer that already sees 6 partitions puts the task on a new one
	cl := kafkaClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: ingress, Partition: murmur2Partition(task, 6), Key: []byte(task),
		Value: encodeEvent(t, c, validEvent("g-1", task))}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	audit := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool { return len(byTask(a, task)) == 2 })
	recs := byTask(audit, task)
	if len(recs) != 2 || str(recs[0], "decision.rule") != "partition.forward" ||
		str(recs[1], "decision.class")+"/"+str(recs[1], "decision.route") != "SUCCEEDED/COMPLETE" ||
		get(recs[1], "input.partition") != float64(murmur2Partition(task, 3)) {
		t.Fatalf("task %s on a new partition: audit %v, want a forward, then SUCCEEDED/COMPLETE on partition %d\nlogs:\n%s",
			task, recs, murmur2Partition(task, 3), r.logs.String())
	}
	for sample, want := range map[string]float64{
		`faultrouter_partitions{topic="` + ingress + `"}`:              6,
		`faultrouter_partition_changes_total{topic="` + ingress + `"}`: 1,
	} {
		if got, ok := scrape(t, r.metrics, sample); !ok || got != want {
			t.Errorf("/metrics %s = %v (present %v), want %v", sample, got, ok, want)
		}
	}
}
