package console

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Guards the dead-letter re-drive: a selection by filter is previewed with
// its count and what the loop guard refuses, nothing is sent until the
// preview is confirmed, and the job then re-drives exactly the
// records the filter selected to ingress, with lineage headers naming the
// operator and the reason, and records who ran it and why. A reviewer without
// the operator role is refused.
func TestRedriveByFilterPreviewThenJob(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{
		{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}},
		{Name: "rita", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"*"}},
	}}
	base, opts, set := testConsole(t, Config{Users: users, RedriveRate: 1})
	dl, _ := set.Name("deadletter")
	ingress, _ := set.Name("ingress")
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	poison := func(key, kind string, count int) *kgo.Record {
		hs := []kgo.RecordHeader{{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte(kind)},
			{Key: codec.HeaderErrorMessage, Value: []byte("bad bytes")}}
		if count > 0 {
			hs = append(hs, kgo.RecordHeader{Key: codec.HeaderRedriveCount, Value: []byte{byte('0' + count)}})
		}
		return &kgo.Record{Topic: dl, Partition: 0, Key: []byte(key), Value: []byte("raw-" + key), Headers: hs}
	}
	ctx := context.Background()
	if err := cl.ProduceSync(ctx, poison("t-a", "not_single_object", 0), poison("t-b", "not_single_object", 0),
		poison("t-c", "not_single_object", 3), poison("t-d", "empty_key", 0)).FirstErr(); err != nil {
		t.Fatal(err)
	}

	olga := newClient(t, base)
	olga.login("olga")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, body := olga.do(http.MethodGet, "/deadletter", nil); strings.Count(body, `data-id=`) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead-letter page never showed the 4 records")
		}
		time.Sleep(50 * time.Millisecond)
	}
	form := url.Values{"csrf": {olga.token("/deadletter")}, "select": {"filter"}, "class": {"INVALID_INPUT"},
		"kind": {"not_single_object"}, "since": {"-1h"}, "reason": {"decoder fixed"}}
	code, body := olga.do(http.MethodPost, "/deadletter/redrive", form)
	if code != http.StatusOK || !regexp.MustCompile(`Would re-drive <b>2</b> of 3 selected record\(s\) to ingress; <b>1</b> refused`).MatchString(body) {
		t.Fatalf("preview: %d, want 2 of 3 to send and 1 refused by the loop guard; body:\n%s", code, body)
	}
	if n := countRecords(t, opts, ingress); n != 0 {
		t.Fatalf("the preview sent %d records to ingress", n)
	}

	rita := newClient(t, base)
	rita.login("rita")
	rform := url.Values{"csrf": {rita.token("/review")}, "select": {"filter"}, "reason": {"x"}, "run": {"1"}, "confirm": {"2"}}
	if code, body := rita.do(http.MethodPost, "/deadletter/redrive", rform); code != http.StatusForbidden || !strings.Contains(body, "operator role") {
		t.Errorf("a reviewer's re-drive: %d, want 403 naming the operator role", code)
	}

	if code, body := olga.do(http.MethodPost, "/deadletter/redrive", confirmation(t, body, "/deadletter/redrive", url.Values{"run": {"1"}})); code != http.StatusSeeOther {
		t.Fatalf("run: %d; body:\n%s", code, body)
	}
	var recs []*kgo.Record
	deadline = time.Now().Add(15 * time.Second)
	for len(recs) < 2 && time.Now().Before(deadline) {
		recs = readAll(t, opts, ingress)
		time.Sleep(100 * time.Millisecond)
	}
	keys := map[string]*kgo.Record{}
	for _, r := range recs {
		keys[string(r.Key)] = r
	}
	if len(recs) != 2 || keys["t-a"] == nil || keys["t-b"] == nil {
		t.Fatalf("ingress after the job: %d records, want t-a and t-b", len(recs))
	}
	hs := codec.ParseHeaders(keys["t-a"].Headers)
	if hs.Redrive == nil || hs.Redrive.Count != 1 || hs.Redrive.Reason != "decoder fixed" || hs.Redrive.SourceTopic != dl || string(keys["t-a"].Value) != "raw-t-a" ||
		hs.Redrive.Operator != "olga" {
		t.Errorf("re-driven record: %+v value %q, want the original bytes, count 1, the reason, the source and operator olga", hs.Redrive, keys["t-a"].Value)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, body := olga.do(http.MethodGet, "/deadletter", nil)
		if strings.Contains(body, "olga") && strings.Contains(body, "decoder fixed") && regexp.MustCompile(`job-state">done`).MatchString(body) &&
			strings.Contains(body, "2 / 2 (1 refused)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the jobs table never showed olga's finished job; body:\n%s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readAll reads every record of topic.
func readAll(t *testing.T, opts []kgo.Opt, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.KeepControlRecords())...) // a transaction's marker may be the last offset
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// to the end offsets listed now: a fixed wait reads nothing on a slow
	// machine (the race detector)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(left) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	if len(left) > 0 {
		t.Fatalf("%s: partitions %v not read to their end within 30 s", topic, left)
	}
	return out
}

func countRecords(t *testing.T, opts []kgo.Opt, topic string) int {
	return len(readAll(t, opts, topic))
}

// Guards the job controls: a paused job sends nothing until resumed, a
// stopped job sends nothing more, and both show on the page. Every chunk's
// records take 0.8 s to reach the broker, so the pause comes while one is in
// flight: the page shows the job paused only once that chunk has been sent
// and committed, and nothing is sent after.
func TestRedriveJobPauseResumeStop(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}}}}
	cluster, opts, set := testKfake(t)
	base, _ := startConsole(t, opts, set, Config{Users: users, RedriveRate: 1})
	dl, _ := set.Name("deadletter")
	ingress, _ := set.Name("ingress")
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, k := range []string{"t-1", "t-2", "t-3", "t-4"} {
		recs = append(recs, &kgo.Record{Topic: dl, Key: []byte(k), Value: []byte("raw"), Headers: []kgo.RecordHeader{
			{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("k")}}})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// from now on every chunk's records take 0.8 s to reach the broker
	slowed := map[kmsg.Request]bool{}
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !slowed[req] { // once per request: a woken request runs this again
			slowed[req] = true
			cluster.SleepControl(func() { time.Sleep(800 * time.Millisecond) })
		}
		return nil, nil, false
	})
	olga := newClient(t, base)
	olga.login("olga")
	waitPage := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			_, body := olga.do(http.MethodGet, "/deadletter", nil)
			if ok(body) {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the page never showed it; body:\n%s", what, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPage("4 dead letters", func(b string) bool { return strings.Count(b, "data-id=") == 4 })
	tok := olga.token("/deadletter")
	_, preview := olga.do(http.MethodPost, "/deadletter/redrive", url.Values{"csrf": {tok}, "select": {"filter"}, "reason": {"r"}})
	if code, body := olga.do(http.MethodPost, "/deadletter/redrive", confirmation(t, preview, "/deadletter/redrive", url.Values{"run": {"1"}})); code != http.StatusSeeOther {
		t.Fatalf("run: %d; body:\n%s", code, body)
	}
	body := waitPage("a running job", func(b string) bool { return strings.Contains(b, `job-state">running`) })
	id := regexp.MustCompile(`data-job="([^"]+)"`).FindStringSubmatch(body)[1]
	if code, _ := olga.do(http.MethodPost, "/deadletter/jobs/"+id+"/pause", url.Values{"csrf": {tok}}); code != http.StatusSeeOther {
		t.Fatalf("pause: %d", code)
	}
	waitPage("the paused job", func(b string) bool { return strings.Contains(b, `job-state">paused`) })
	sent := countRecords(t, opts, ingress)
	time.Sleep(time.Second) // longer than a chunk takes to reach the broker: the paused job sends nothing meanwhile
	if again := countRecords(t, opts, ingress); again != sent || sent >= 4 {
		t.Fatalf("while paused: %d then %d records on ingress, want no change and fewer than 4", sent, again)
	}
	if code, _ := olga.do(http.MethodPost, "/deadletter/jobs/"+id+"/resume", url.Values{"csrf": {tok}}); code != http.StatusSeeOther {
		t.Fatalf("resume: %d", code)
	}
	if code, _ := olga.do(http.MethodPost, "/deadletter/jobs/"+id+"/stop", url.Values{"csrf": {tok}}); code != http.StatusSeeOther {
		t.Fatalf("stop: %d", code)
	}
	waitPage("the stopped job", func(b string) bool { return strings.Contains(b, `job-state">stopped`) })
	final := countRecords(t, opts, ingress)
	if final >= 4 {
		t.Errorf("the stopped job sent all %d records", final)
	}
	if again := countRecords(t, opts, ingress); again != final {
		t.Errorf("after the stop: %d then %d records on ingress, want no change", final, again)
	}
	if code, body := olga.do(http.MethodPost, "/deadletter/jobs/"+id+"/resume", url.Values{"csrf": {tok}}); code != http.StatusConflict || !strings.Contains(body, "stopped already") {
		t.Errorf("resuming a stopped job: %d, want 409 saying it is stopped", code)
	}
}
