package router

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards the commit of a cooperative member that rejoined: franz-go lets
// a commit wait out the join and then makes it in the new generation, a
// moment before the assignment callback has set what the member keeps. The
// fence's owner waits for the generation the commit is made in, so the
// batch of the kept partitions commits (with their offsets) instead of
// aborting on a generation the router has not recorded yet. It does not
// wait for an instance that owns nothing, nor past an assignment that never
// comes.
func TestOwnedInWaitsForTheCommitsGeneration(t *testing.T) {
	r := &Router{owned: map[int32]bool{1: true, 4: true}, ownedGen: 5}
	go func() {
		time.Sleep(20 * time.Millisecond)
		r.mu.Lock()
		delete(r.owned, 4)
		r.ownedGen = 6
		r.mu.Unlock()
	}()
	if owned, gen := r.ownedIn(6); gen != 6 || !slices.Equal(owned, []int32{1}) {
		t.Errorf("a commit in generation 6 while the callback of 6 runs: owned %v of generation %d, want [1] of 6", owned, gen)
	}
	if owned, gen := r.ownedIn(6); gen != 6 || len(owned) != 1 {
		t.Errorf("a commit in the current generation: owned %v of generation %d", owned, gen)
	}
	if _, gen := r.ownedIn(5); gen != 6 {
		t.Errorf("a commit in an older generation: generation %d returned, want the current 6 (the fence aborts it)", gen)
	}
	nothing := &Router{owned: map[int32]bool{}, ownedGen: -1}
	if owned, _ := nothing.ownedIn(9); len(owned) != 0 {
		t.Errorf("an instance that owns nothing: %v", owned)
	}
	// no callback of generation 7 comes: the fence gets generation 6 and
	// aborts the transaction
	if _, gen := r.ownedIn(7); gen != 6 {
		t.Errorf("no assignment of generation 7: generation %d, want 6", gen)
	}
}

// Guards the commit of a member that rejoins a cooperative group: it waits
// until the join is done (the next assignment clears rejoining), since
// franz-go would send an offset commit prepared meanwhile in the
// generation the join ended, to be refused; it does not wait once the join
// is done, past joinWait, or past its context.
func TestAwaitJoinedWaitsForTheAssignment(t *testing.T) {
	r := &Router{}
	r.rejoining.Store(true)
	cleared := make(chan time.Time, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cleared <- time.Now()
		r.rejoining.Store(false)
	}()
	r.awaitJoined(context.Background())
	if r.rejoining.Load() {
		t.Error("returned while the member was still rejoining")
	}
	<-cleared
	r.awaitJoined(context.Background()) // joined: at once

	r.rejoining.Store(true) // no assignment comes
	r.awaitJoined(context.Background())
	if !r.rejoining.Load() {
		t.Error("rejoining cleared by the wait itself")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.awaitJoined(ctx) // a shutdown does not wait
}

// Guards the end of a transaction that a revoke came in: franz-go's
// session aborts it, so it does not wait for the rejoin (the partitions'
// next owner waits for its end before it restores them).
func TestAwaitJoinedDoesNotHoldATransactionARevokeCameIn(t *testing.T) {
	cfg := Default()
	cfg.StateDir = t.TempDir()
	cfg.ClientOpts = []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")} // never dialled
	cfg.Topics = Topics{Ingress: "in", Decisions: "dec", Retry: "retry", Review: "review", Audit: "audit",
		DeadLetter: "dead", Alerts: "alerts", State: "state"}
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.store.Close() })
	r.syncs.record(syncAssignment{cooperative: true})
	r.onRevoked(context.Background(), nil, map[string][]int32{cfg.Topics.Ingress: {3}})
	if !r.revokedInTxn.Load() {
		t.Fatal("a revoke did not mark the transaction open as one the session aborts")
	}
	r.rejoining.Store(true)
	go func() {
		time.Sleep(300 * time.Millisecond)
		r.rejoining.Store(false)
	}()
	r.awaitJoined(context.Background())
	if !r.rejoining.Load() {
		t.Error("the end of a transaction a revoke came in waited for the rejoin")
	}
}
