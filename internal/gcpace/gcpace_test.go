package gcpace

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"testing"
	"time"
)

func TestPercentPacesTheHeapGoalToTheBudget(t *testing.T) {
	const budget = 300 << 20
	for _, c := range []struct {
		live int64
		want int
	}{
		{0, 200},
		{50 << 20, 200},  // a sixth of the budget: at most twice Go's default
		{100 << 20, 200}, // a third: the goal is the budget at 200
		{120 << 20, 150}, // 120 + 150% = 300
		{150 << 20, 100}, // half: Go's default reaches the budget
		{400 << 20, 100}, // over it: never below Go's default
	} {
		if got := Percent(c.live, budget); got != c.want {
			t.Errorf("Percent(%d MiB, 300 MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// gogc is GOGC as the runtime has it, read without setting it.
func gogc() int {
	s := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}}
	rtmetrics.Read(s)
	return int(s[0].Value.Uint64())
}

// waitGOGC collects until GOGC is want (Tune sets it after a collection,
// on the finalizer goroutine), and fails after many collections.
func waitGOGC(t *testing.T, want int, what string) {
	t.Helper()
	for range 500 {
		runtime.GC()
		if gogc() == want {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s: GOGC %d, want %d", what, gogc(), want)
}

// Tune follows the live heap after collections: 200 while it is small
// against the budget, 100 once it is half the budget, 200 again when it
// is let go; it waits while a restore is relaxed, and stop puts GOGC back.
func TestTuneFollowsTheLiveHeap(t *testing.T) {
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	const budget = 64 << 20
	stop := Tune(budget)
	waitGOGC(t, 200, "a small live heap")

	keep := make([][]byte, 48)
	for i := range keep {
		keep[i] = make([]byte, 1<<20)
	}
	waitGOGC(t, 100, "a live heap of 48 MiB against a 64 MiB budget")
	runtime.KeepAlive(keep)
	keep = nil

	undo := Relax(1 << 20)
	for range 5 {
		runtime.GC()
		time.Sleep(2 * time.Millisecond)
	}
	if p := gogc(); p != -1 {
		t.Errorf("GOGC %d after collections while a restore is relaxed, want -1 (off: the pacing waits)", p)
	}
	if l := debug.SetMemoryLimit(-1); l <= 1<<20 || l == (1<<63-1) {
		t.Errorf("memory limit while relaxed %d, want twice the live heap and the extra", l)
	}
	undo()
	undo() // a second undo changes nothing
	waitGOGC(t, 200, "the live heap let go, the restore over")

	stop()
	stop()
	if p := gogc(); p != 77 {
		t.Errorf("GOGC after stop %d, want 77 as before", p)
	}
	stopAgain := Tune(budget)
	defer stopAgain()
	waitGOGC(t, 200, "a second Tune after the first stopped")
}

// An operator's GOGC wins: Tune leaves it alone.
func TestTuneLeavesAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	before := debug.SetGCPercent(150)
	defer debug.SetGCPercent(before)
	stop := Tune(64 << 20)
	defer stop()
	for range 5 {
		runtime.GC()
		time.Sleep(2 * time.Millisecond)
	}
	if p := gogc(); p != 150 {
		t.Errorf("GOGC %d with GOGC=150 set, want 150", p)
	}
}

// A Tune that starts while a restore is relaxed leaves the collector off
// until the restore ends, then paces it; its stop puts back what was
// there before either.
func TestTuneStartedDuringARestoreWaitsForIt(t *testing.T) {
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	undo := Relax(1 << 20)
	stop := Tune(64 << 20)
	runtime.GC()
	if p := gogc(); p != -1 {
		t.Errorf("GOGC %d while the restore is relaxed, want -1 (off)", p)
	}
	undo()
	if p := gogc(); p != 200 {
		t.Errorf("GOGC %d once the restore ended, want 200 (a small live heap)", p)
	}
	stop()
	if p := gogc(); p != 77 {
		t.Errorf("GOGC %d after stop, want 77 as before", p)
	}
}
