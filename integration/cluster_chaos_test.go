package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// The router on a three-broker cluster, as production runs it: topics at
// replication 3 with min.insync.replicas 2, where a broker's death moves
// partition leaders and transaction and group coordinators while
// transactions are open. The cluster is integration/kafka.sh's cluster
// mode; integration/test.sh starts it and names it in FAULTROUTER_TEST_CLUSTER
// (and FAULTROUTER_TEST_BROKERS, which every helper of the package reads).

// clusterBrokers returns the cluster's bootstrap servers, or skips the test
// when no cluster is named. It fails when the tests' broker is another one,
// or when kafka.sh would kill the nodes of another cluster.
func clusterBrokers(t *testing.T) string {
	t.Helper()
	c := os.Getenv("FAULTROUTER_TEST_CLUSTER")
	if c == "" {
		t.Skip("FAULTROUTER_TEST_CLUSTER is unset: this test needs the three-node cluster of `integration/kafka.sh cluster start` (integration/test.sh starts it)")
	}
	if c != brokers {
		t.Fatalf("FAULTROUTER_TEST_CLUSTER=%s but FAULTROUTER_TEST_BROKERS=%s: set both to the cluster", c, brokers)
	}
	out, err := exec.Command("../integration/kafka.sh", "cluster", "brokers").Output()
	if err != nil || strings.TrimSpace(string(out)) != c {
		t.Fatalf("kafka.sh cluster would kill the nodes of %q, but the tests run against %q (set FAULTROUTER_KAFKA_DIR and FAULTROUTER_KAFKA_CLUSTER_PORT as for its start)",
			strings.TrimSpace(string(out)), c)
	}
	return c
}

// kafkaCluster runs `integration/kafka.sh cluster args...`.
func kafkaCluster(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("../integration/kafka.sh", append([]string{"cluster"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kafka.sh cluster %s: %v", strings.Join(args, " "), err)
	}
}

// Guards exactly once on a three-broker cluster: topics applied at
// replication 3 (min.insync.replicas 2), two routers of one group route a
// load that a producer feeds throughout, while one broker at a time is
// SIGKILLed (three times, each time the one that leads most of the test's
// partitions) and started again once the partitions' leaders moved away
// from it; the next kill waits until it is back in every ISR. Every input
// has exactly one audit record with its decision, every routed record and
// every retry is published once, nothing of an aborted transaction is
// visible with read_committed, and no router exits. The closing note gives
// the kills, the records, and what each router logged about leaders,
// coordinators and aborts while a leader moved.
func TestClusterChaos(t *testing.T) {
	cluster := clusterBrokers(t)
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	began := time.Now()

	e.cli("", "topics", "apply", "--partitions", "3", "--replication-factor", "3")
	topics := requireReplicated(ctx, t, e)
	pol := append(quietBreakers(t), "--replication-factor", "3") // what the topics have, or run refuses to start
	routers := map[string]*router{"a": e.startRouter("a", t.TempDir(), pol...), "b": e.startRouter("b", t.TempDir(), pol...)}
	t.Logf("cluster %s: %d topics at replication 3, min.insync.replicas 2; routers a and b ready after %s",
		cluster, len(topics), time.Since(began).Round(100*time.Millisecond))

	load := startClusterLoad(ctx, t, e.prefix+"ai.tasks.ingress", "cluster", 500)
	var kills []clusterKill
	last := int32(-1)
	for k := 1; k <= 3; k++ {
		pause(3 * time.Second) // records flow before each kill
		kills = append(kills, killBroker(ctx, t, e, k, last, &load.produced, routers))
		last = int32(kills[len(kills)-1].node)
	}
	time.Sleep(2 * time.Second) // and after the last
	s := load.stop(t)
	t.Logf("produced %d records (%d tasks, %d redeliveries, %d undecodable) in %s",
		s.total(), s.tasks, s.redeliveries, s.poison, time.Since(load.began).Round(100*time.Millisecond))

	if !waitFor(3*time.Minute, func() bool { return consumedAll(ctx, e, e.prefix+"ai.tasks.ingress") }) {
		t.Fatalf("the routers did not consume every ingress record within 3 min; logs of a:\n%s\nlogs of b:\n%s",
			tailLines(routers["a"].logs.String(), 30), tailLines(routers["b"].logs.String(), 30))
	}
	retries := 0
	for i := 0; i < s.tasks; i++ {
		if want[kind(i%int(nKinds))].route == "RETRY" {
			retries++
		}
	}
	waitFor(60*time.Second, func() bool { return len(readTopic(ctx, t, e.prefix+"ai.tasks.retry", true)) >= retries })
	rep := verify(ctx, t, e, s)
	if rep.retries != retries {
		t.Errorf("retry topic holds %d records, want %d (one per retrying task)", rep.retries, retries)
	}
	for _, name := range []string{"a", "b"} {
		if r := routers[name]; !r.running() {
			t.Errorf("router %s exited during the broker kills; logs:\n%s", name, tailLines(r.logs.String(), 40))
		}
	}
	for _, name := range []string{"a", "b"} {
		if routers[name].running() {
			routers[name].stop(t)
		}
	}

	// the closing note
	var note strings.Builder
	fmt.Fprintf(&note, "three-broker chaos: %d SIGKILLs of one broker at a time; %d records produced during them (%d tasks, %d redeliveries, %d undecodable); "+
		"%d inputs, %d audit records (%d DROP), %d review, %d deadletter, %d retries; %d records of aborted transactions, none visible read_committed; took %s\n",
		len(kills), s.total(), s.tasks, s.redeliveries, s.poison, rep.inputs, rep.audit, rep.dropped, rep.review, rep.deadletter, rep.retries,
		rep.abortedRecords, time.Since(began).Round(time.Second))
	for _, k := range kills {
		k.write(&note)
	}
	t.Log(note.String())
}

// requireReplicated fails unless every topic of the test has replication
// factor 3 and min.insync.replicas 2, and returns their names.
func requireReplicated(ctx context.Context, t *testing.T, e *env) []string {
	t.Helper()
	adm := newAdmin(t)
	set, err := topicspec.Load(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, short := range topicspec.Shorts() {
		name, err := set.Name(short)
		if err != nil {
			t.Fatal(err)
		}
		topics = append(topics, name)
	}
	// every broker's metadata has them soon after they were created
	var md kadm.Metadata
	if !waitFor(30*time.Second, func() bool {
		md, err = adm.Metadata(ctx, topics...)
		return err == nil && md.Topics.Error() == nil
	}) {
		t.Fatalf("the topics are not all there 30 s after topics apply: %v %v", err, md.Topics.Error())
	}
	for _, name := range topics {
		for _, p := range md.Topics[name].Partitions {
			if len(p.Replicas) != 3 {
				t.Fatalf("%s/%d has %d replicas %v, want 3", name, p.Partition, len(p.Replicas), p.Replicas)
			}
		}
	}
	// and every broker that answers DescribeConfigs knows them: one that
	// lags their creation answers UNKNOWN_TOPIC_OR_PARTITION for a moment
	var rcs kadm.ResourceConfigs
	if !waitFor(30*time.Second, func() bool {
		rcs, err = adm.DescribeTopicConfigs(ctx, topics...)
		if err != nil {
			return false
		}
		for _, rc := range rcs {
			if rc.Err != nil {
				err = fmt.Errorf("describe %s: %w", rc.Name, rc.Err)
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the topics' configs are not all there 30 s after topics apply: %v", err)
	}
	for _, rc := range rcs {
		got := "unset"
		for _, c := range rc.Configs {
			if c.Key == "min.insync.replicas" {
				got = c.MaybeValue()
			}
		}
		if got != "2" {
			t.Fatalf("%s: min.insync.replicas %s, want 2", rc.Name, got)
		}
	}
	return topics
}

func newAdmin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// clusterLoad produces the chaos workload (chaosEvent) to ingress at a
// steady rate until stopped: task i, every tenth task an exact redelivery
// of one 300 tasks earlier, every 2,000th record an undecodable one.
type clusterLoad struct {
	run      string
	began    time.Time
	produced atomic.Int64 // acknowledged records
	halt     chan struct{}
	done     chan error
	s        stream // what was sent, once stopped
}

func startClusterLoad(ctx context.Context, t *testing.T, topic, run string, rate int) *clusterLoad {
	t.Helper()
	l := &clusterLoad{run: run, began: time.Now(), halt: make(chan struct{}), done: make(chan error, 1)}
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.RecordRetries(1_000_000), kgo.RecordDeliveryTimeout(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer cl.Close()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			perr error
		)
		send := func(key string, val []byte) {
			wg.Add(1)
			cl.Produce(ctx, &kgo.Record{Key: []byte(key), Value: val}, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					perr = err
					mu.Unlock()
					return
				}
				l.produced.Add(1)
			})
		}
		task := func(i int) {
			ev := chaosEvent(run, i)
			v, err := c.EncodeTaskEvent(nil, &ev)
			if err != nil {
				mu.Lock()
				perr = err
				mu.Unlock()
				return
			}
			send(ev.TaskID, v)
		}
		sent := 0
		for i := 0; ; i++ {
			select {
			case <-l.halt:
				wg.Wait()
				l.done <- perr
				return
			default:
			}
			task(i)
			sent++
			l.s.tasks++
			if i%10 == 9 && i >= 300 {
				task(i - 300 + rand.IntN(300))
				sent++
				l.s.redeliveries++
			}
			if sent%2000 == 0 {
				send(fmt.Sprintf("%s-poison%d", run, l.s.poison), []byte("not avro at all"))
				sent++
				l.s.poison++
			}
			if due := l.began.Add(time.Duration(sent) * time.Second / time.Duration(rate)); i%50 == 0 && time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
		}
	}()
	return l
}

// stop ends the load once every record sent is acknowledged and returns
// what it sent.
func (l *clusterLoad) stop(t *testing.T) stream {
	t.Helper()
	close(l.halt)
	if err := <-l.done; err != nil {
		t.Fatalf("produce: %v", err)
	}
	l.s.run = l.run
	if got := l.produced.Load(); got != int64(l.s.total()) {
		t.Fatalf("produce: %d records acknowledged, %d sent", got, l.s.total())
	}
	return l.s
}

// clusterKill is what one broker kill did and what the routers logged
// meanwhile.
type clusterKill struct {
	n, node              int
	led                  int    // the test's partitions the node led when killed
	coordinates          string // the group and transactions it coordinated
	atRecords, recovered int64  // records acknowledged at the kill and once the node was back in every ISR
	moved, back          time.Duration
	logged               map[string][]string // per router, the lines movedRe picks
}

func (k clusterKill) write(b *strings.Builder) {
	fmt.Fprintf(b, "kill %d: broker %d (led %d of the test's partitions; %s) at %d records; leaders moved after %s; restarted and back in every ISR after %s, at %d records\n",
		k.n, k.node, k.led, k.coordinates, k.atRecords, k.moved.Round(100*time.Millisecond), k.back.Round(100*time.Millisecond), k.recovered)
	for _, name := range slices.Sorted(maps.Keys(k.logged)) {
		lines := k.logged[name]
		fmt.Fprintf(b, "  router %s logged %d lines about leaders, coordinators, rebalances, aborts or warnings meanwhile\n", name, len(lines))
		for _, l := range summarize(lines, 16) {
			fmt.Fprintf(b, "    %s\n", l)
		}
	}
}

// movedRe picks the router log lines about a leader or coordinator move
// and what it cost: NOT_LEADER and coordinator errors, the group's
// rebalance when its coordinator moved (joins, lost and revoked
// partitions), aborted transactions, and any warning or error.
var movedRe = regexp.MustCompile(`(?i)leader|coordinator|abort|on_lost|on_revoke|level=(WARN|ERROR)`)

// killBroker SIGKILLs the broker that leads most of the test's partitions
// (not the last one killed), waits until no partition of the test's topics,
// the group offsets and the transaction state is led by it, starts it
// again and waits until it is in every ISR of them. produced counts the
// records produced so far; routers are the running instances.
func killBroker(ctx context.Context, t *testing.T, e *env, n int, last int32, produced *atomic.Int64, routers map[string]*router) clusterKill {
	t.Helper()
	adm := newAdmin(t)
	md, err := adm.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for name := range md.Topics {
		if strings.HasPrefix(name, e.prefix) {
			topics = append(topics, name)
		}
	}
	watched := append(slices.Clone(topics), "__consumer_offsets", "__transaction_state")
	parts := partitionDetails(ctx, t, adm, watched)
	leads := map[int32]int{}
	for _, p := range parts {
		if slices.Contains(topics, p.Topic) {
			leads[p.Leader]++
		}
	}
	node := int32(-1)
	for _, id := range []int32{1, 2, 3} {
		if id != last && (node < 0 || leads[id] > leads[node]) {
			node = id
		}
	}
	k := clusterKill{n: n, node: int(node), led: leads[node], logged: map[string][]string{}}
	for name := range routers {
		k.logged[name] = nil
	}
	var coord []string
	for _, c := range adm.FindGroupCoordinators(ctx, e.prefix+"router") {
		if c.Err == nil && c.NodeID == node {
			coord = append(coord, "coordinator of the routers' group")
		}
	}
	var txnIDs []string // the transactional ID is <group>-<instance-id>
	for _, name := range slices.Sorted(maps.Keys(routers)) {
		txnIDs = append(txnIDs, e.prefix+"router-"+name)
	}
	for _, c := range adm.FindTxnCoordinators(ctx, txnIDs...) {
		if c.Err == nil && c.NodeID == node {
			coord = append(coord, "transaction coordinator of "+c.Name)
		}
	}
	k.coordinates = "no coordinator"
	if len(coord) > 0 {
		k.coordinates = strings.Join(coord, ", ")
	}
	marks := map[string]int{}
	for name, r := range routers {
		marks[name] = len(r.logs.String())
	}

	k.atRecords = produced.Load()
	killed := time.Now()
	kafkaCluster(t, "kill", fmt.Sprint(node))
	if !waitFor(90*time.Second, func() bool {
		for _, p := range partitionDetails(ctx, t, adm, watched) {
			if p.Leader == node || p.Leader < 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("kill %d: the partitions' leaders did not move away from broker %d within 90 s", n, node)
	}
	k.moved = time.Since(killed)
	kafkaCluster(t, "start", fmt.Sprint(node))
	if !waitFor(2*time.Minute, func() bool {
		for _, p := range partitionDetails(ctx, t, adm, watched) {
			if !slices.Contains(p.ISR, node) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("kill %d: broker %d was not back in every ISR within 2 min of its start", n, node)
	}
	k.back, k.recovered = time.Since(killed), produced.Load()
	for name, r := range routers {
		for _, l := range strings.Split(r.logs.String()[marks[name]:], "\n") {
			// not the lines of one task (its decisions and alerts)
			if movedRe.MatchString(l) && !strings.HasPrefix(l, "[TASK:") {
				k.logged[name] = append(k.logged[name], l)
			}
		}
		if !r.running() {
			t.Fatalf("kill %d: router %s exited; logs:\n%s", n, name, tailLines(r.logs.String(), 40))
		}
	}
	var b strings.Builder
	k.write(&b)
	t.Log(b.String())
	// the load flowed through the kill: the producer kept writing to the
	// two brokers left (min.insync.replicas 2) once the leaders moved
	if k.recovered <= k.atRecords {
		t.Fatalf("kill %d: no record was acknowledged between the kill of broker %d and its return to the ISR", n, node)
	}
	return k
}

// partitionDetails is every partition of the topics (those that exist).
func partitionDetails(ctx context.Context, t *testing.T, adm *kadm.Client, topics []string) []kadm.PartitionDetail {
	t.Helper()
	md, err := adm.Metadata(ctx)
	if err != nil {
		t.Logf("metadata: %v", err)
		return []kadm.PartitionDetail{{Leader: -1}} // not known: waits on
	}
	var out []kadm.PartitionDetail
	for _, name := range topics {
		if d, ok := md.Topics[name]; ok {
			out = append(out, d.Partitions.Sorted()...)
		}
	}
	return out
}

// fieldRe strips a log line's time and the fields that differ from one
// line of a kind to the next.
var fieldRe = regexp.MustCompile(`^time=\S+ |\b(broker|partition|epoch|leader_epoch|id|producer_id|offset|time)=\S+`)

// summarize returns the distinct lines (their time and numbers stripped),
// each with its count, in the order they first appeared, at most n of them.
func summarize(lines []string, n int) []string {
	count := map[string]int{}
	var kinds []string
	for _, l := range lines {
		k := fieldRe.ReplaceAllString(l, "")
		if count[k]++; count[k] == 1 {
			kinds = append(kinds, k)
		}
	}
	var out []string
	for i, l := range kinds {
		if i == n {
			out = append(out, fmt.Sprintf("... and %d other kinds of line", len(kinds)-n))
			break
		}
		c := count[l]
		if len(l) > 400 {
			l = l[:400] + "..."
		}
		out = append(out, fmt.Sprintf("%dx %s", c, l))
	}
	return out
}
