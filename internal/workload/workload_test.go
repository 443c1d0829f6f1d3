package workload

import (
	"reflect"
	"testing"
	"time"
)

// Guards the mix make bench and the Go benchmarks share: every task gets a
// shape (the weights make up 100), the same seed, task and attempt give the
// same event, and each shape shows in about its share of tasks.
func TestEventIsDeterministicAndMixed(t *testing.T) {
	total := 0
	for _, s := range shapes {
		total += s.weight
	}
	if total != 100 {
		t.Fatalf("shape weights add up to %d, want 100", total)
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const tasks = 10_000
	timeouts, redelivered := 0, 0
	for i := range tasks {
		first := Event("t", 7, i, 1, at)
		if again := Event("t", 7, i, 1, at); !reflect.DeepEqual(first, again) {
			t.Fatalf("task %d: two events for the same seed, task and attempt:\n%+v\n%+v", i, first, again)
		}
		if first.Error != nil && first.Error.Type == "TimeoutError" && first.Operation == nil {
			timeouts++
		}
		if third := Event("t", 7, i, 3, at); third.Attempt == 2 {
			redelivered++
		}
	}
	// 40% timeout first, 12% end with an exact redelivery of attempt 2
	if timeouts < tasks*35/100 || timeouts > tasks*45/100 {
		t.Errorf("%d of %d tasks time out first, want about 40%%", timeouts, tasks)
	}
	if redelivered < tasks*9/100 || redelivered > tasks*15/100 {
		t.Errorf("%d of %d tasks redeliver attempt 2, want about 12%%", redelivered, tasks)
	}
	if e := Event("t", 7, 1, 1, at); e.TaskID != "t-00000001" || e.EventID != "t-00000001-a1" || e.Status == "" || e.Source == "" {
		t.Errorf("event %+v: want task t-00000001, event t-00000001-a1, a status and a source", e)
	}
}
