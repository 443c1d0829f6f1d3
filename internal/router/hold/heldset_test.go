package hold

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/breaker"
)

// heldModel is what the held set must hold: per task ID, its partition and
// breakers.
type heldModel map[string]struct {
	p    int32
	refs []breaker.Ref
}

// checkHeld compares the held set with the model: every task's entry by ID,
// the retries behind every breaker (each once), the count, and that no task
// outside the model is found.
func checkHeld(t *testing.T, h *heldSet, m heldModel, refs []breaker.Ref, ids []string) {
	t.Helper()
	if h.len() != len(m) {
		t.Fatalf("len %d, want %d", h.len(), len(m))
	}
	for _, id := range ids {
		r, ok := h.get(id)
		want, held := m[id]
		if ok != held {
			t.Fatalf("task %s held %v, want %v", id, ok, held)
		}
		if !ok {
			continue
		}
		var got []breaker.Ref
		for _, i := range r.refs[:r.n] {
			got = append(got, h.refs[i])
		}
		if r.id != id || r.partition != want.p || !slices.Equal(got, want.refs) {
			t.Fatalf("task %s: %q p%d %v, want p%d %v", id, r.id, r.partition, got, want.p, want.refs)
		}
	}
	for _, ref := range refs {
		got := h.behind(map[breaker.Ref]bool{ref: true})
		slices.Sort(got)
		var want []string
		for id, e := range m {
			if slices.Contains(e.refs, ref) {
				want = append(want, id)
			}
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("behind %v: %v, want %v", ref, got, want)
		}
	}
	// behind several breakers at once names each retry once
	all := map[breaker.Ref]bool{}
	for _, ref := range refs {
		all[ref] = true
	}
	got := h.behind(all)
	slices.Sort(got)
	want := slices.Sorted(maps.Keys(m))
	if !slices.Equal(got, want) {
		t.Fatalf("behind every breaker: %d retries, want %d", len(got), len(want))
	}
}

// Guards the held set (the retries held behind breakers that releaseHeld
// releases): after any sequence of holds, re-holds behind other breakers,
// removals (a task that moved on) and batches that commit or roll back, it
// finds each held task by ID with its partition and breakers, names exactly
// the retries held behind each breaker, and forgets removed ones, including
// across slot reuse, table growth and the shrinking rebuild.
func TestHeldSetAgreesWithAModel(t *testing.T) {
	refs := []breaker.Ref{
		{Scope: breaker.ProviderModel, Key: "acme/m1"}, {Scope: breaker.ProviderModel, Key: "acme/m2"},
		{Scope: breaker.Downstream, Key: "crm"}, {Scope: breaker.Downstream, Key: "mail"},
		{Scope: breaker.PromptTemplate, Key: "refund-v1"}, {Scope: breaker.PromptTemplate, Key: "refund-v2"},
	}
	ids := make([]string, 20_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("task-%d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	h := newHeldSet()
	m := heldModel{}
	peak := 0
	pick := func() []breaker.Ref {
		// one breaker per scope, some scopes missing
		var rs []breaker.Ref
		for sc := range 3 {
			if rng.IntN(3) > 0 {
				rs = append(rs, refs[2*sc+rng.IntN(2)])
			}
		}
		if len(rs) == 0 {
			rs = append(rs, refs[0])
		}
		return rs
	}
	for round := range 60 {
		h.begin()
		saved := maps.Clone(m)
		// early rounds hold many, later rounds remove most: the set grows,
		// then shrinks below a quarter of its slots and is rebuilt
		n, pHold := 1000, 0.8
		if round >= 30 {
			pHold = 0.15
		}
		for range n {
			id := ids[rng.IntN(len(ids))]
			if round >= 30 && len(m) > 0 && rng.IntN(2) == 0 { // a held task moves on
				for id = range m {
					break
				}
			}
			if rng.Float64() < pHold {
				rs := pick()
				p := int32(rng.IntN(6))
				h.put(id, p, rs)
				m[id] = struct {
					p    int32
					refs []breaker.Ref
				}{p, rs}
			} else {
				h.del(id)
				delete(m, id)
			}
		}
		if round%4 == 3 { // the batch did not commit
			h.rollback()
			m = saved
		} else {
			h.commit()
		}
		checkHeld(t, h, m, refs, ids)
		peak = max(peak, len(h.ents))
	}
	if peak < 8192 || (len(h.ents) >= 4096 && h.len()*4 < len(h.ents)) {
		t.Fatalf("%d slots (at most %d) for %d held retries: the set was not rebuilt smaller", len(h.ents), peak, h.len())
	}
	// removing every retry empties every breaker's slice
	h.begin()
	for _, id := range ids {
		h.del(id)
	}
	h.commit()
	checkHeld(t, h, heldModel{}, refs, ids)
	for i, s := range h.byRef {
		if len(s) != 0 {
			t.Fatalf("breaker %v still lists %d slots", h.refs[i], len(s))
		}
	}
}

// Guards a held retry's breakers: a retry names each breaker once and at
// most one per scope's worth (maxHeldRefs), and a task without an ID is not
// held.
func TestHeldSetRecordsEachBreakerOnce(t *testing.T) {
	a := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	b := breaker.Ref{Scope: breaker.Downstream, Key: "crm"}
	h := newHeldSet()
	h.put("t1", 2, []breaker.Ref{a, a, b})
	h.put("", 2, []breaker.Ref{a})
	if h.len() != 1 {
		t.Fatalf("len %d, want 1", h.len())
	}
	r, ok := h.get("t1")
	if !ok || r.n != 2 || h.refs[r.refs[0]] != a || h.refs[r.refs[1]] != b {
		t.Fatalf("t1: %+v %v", r, ok)
	}
	if got := h.behind(map[breaker.Ref]bool{a: true}); !slices.Equal(got, []string{"t1"}) {
		t.Fatalf("behind a: %v", got)
	}
	h.del("t1")
	if got := h.behind(map[breaker.Ref]bool{a: true, b: true}); len(got) != 0 {
		t.Fatalf("behind a, b after removal: %v", got)
	}
}

// Guards the held set's bounds over months: the breakers interned for held
// retries do not grow with every key ever held (keys come from events), and
// the retries held for partitions this instance no longer owns are let go
// (undone with the batch that let them go, if it does not commit).
func TestHeldSetIsBounded(t *testing.T) {
	h := newHeldSet()
	for i := range 20_000 {
		h.begin()
		ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: fmt.Sprintf("template-%d", i)}
		h.put(fmt.Sprintf("task-%d", i), 0, []breaker.Ref{ref})
		if i > 0 {
			h.del(fmt.Sprintf("task-%d", i-1))
		}
		h.commit()
	}
	if len(h.refs) > 2*maxIdleRefs {
		t.Errorf("%d breakers interned after 20,000 keys held one at a time, want at most %d", len(h.refs), 2*maxIdleRefs)
	}
	if r, ok := h.get("task-19999"); !ok || h.refs[r.refs[0]].Key != "template-19999" {
		t.Errorf("the retry still held lost its breaker across the rebuild: %+v %v", r, ok)
	}

	keep := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	h.begin()
	for i := range 100 {
		h.put(fmt.Sprintf("p-%d", i), int32(i%4), []breaker.Ref{keep})
	}
	h.commit()
	h.begin()
	h.keepPartitions(map[int32]bool{0: true, 1: true})
	h.rollback()
	if n := len(h.behind(map[breaker.Ref]bool{keep: true})); n != 100 {
		t.Fatalf("after a rolled back keepPartitions %d retries held behind %v, want 100", n, keep)
	}
	h.begin()
	h.keepPartitions(map[int32]bool{0: true, 1: true})
	h.commit()
	got := h.behind(map[breaker.Ref]bool{keep: true})
	if len(got) != 50 {
		t.Errorf("after keepPartitions(0, 1) %d retries held behind %v, want 50", len(got), keep)
	}
	for _, id := range got {
		if r, _ := h.get(id); r.partition > 1 {
			t.Errorf("retry %s of partition %d still held", id, r.partition)
		}
	}
}
