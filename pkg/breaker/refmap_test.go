package breaker

import (
	"maps"
	"testing"
)

// A RefMap answers as a map[Ref] does: the same key in two scopes is two
// refs, a scope beyond the three is kept too, Len counts what is there
// (setting a ref again adds nothing), and All yields each ref once, also
// while the refs it yielded are deleted.
func TestRefMapIsAMapByRef(t *testing.T) {
	var m RefMap[int]
	want := map[Ref]int{}
	set := func(ref Ref, v int) { m.Set(ref, v); want[ref] = v }
	del := func(ref Ref) { m.Delete(ref); delete(want, ref) }
	check := func(when string) {
		t.Helper()
		if m.Len() != len(want) {
			t.Errorf("%s: Len %d, want %d", when, m.Len(), len(want))
		}
		for ref, v := range want {
			if got, ok := m.Get(ref); !ok || got != v {
				t.Errorf("%s: Get(%v) = %d, %v; want %d", when, ref, got, ok, v)
			}
		}
		got := map[Ref]int{}
		for ref, v := range m.All {
			if _, twice := got[ref]; twice {
				t.Errorf("%s: All yielded %v twice", when, ref)
			}
			got[ref] = v
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: All yielded %v, want %v", when, got, want)
		}
	}
	pm, ds := Ref{ProviderModel, "openai/gpt-4o"}, Ref{Downstream, "openai/gpt-4o"}
	odd := Ref{Scope(7), "openai/gpt-4o"}
	set(pm, 1)
	set(ds, 2)
	set(odd, 3)
	set(pm, 4) // again: replaces
	for i := range 20 {
		set(Ref{PromptTemplate, string(rune('a' + i))}, 10+i)
	}
	check("after sets")
	if _, ok := m.Get(Ref{PromptTemplate, "openai/gpt-4o"}); ok {
		t.Error("Get of a key set in other scopes only: found")
	}
	del(ds)
	del(odd)
	del(Ref{Downstream, "never set"})
	check("after deletes")
	for ref := range m.All {
		if ref.Scope == PromptTemplate {
			del(ref)
		}
	}
	check("after deleting while iterating")
	c := m.Clone()
	m.Set(pm, 99)
	if v, _ := c.Get(pm); v != 4 || c.Len() != m.Len() {
		t.Errorf("a clone sees a later Set: %d, Len %d; want 4, %d", v, c.Len(), m.Len())
	}
	m.Set(pm, 4)
	m.reset()
	want = map[Ref]int{}
	check("after reset")
	if c.Len() == 0 {
		t.Error("a clone emptied by the original's reset")
	}
	set(odd, 5)
	check("after a set past reset")
}

// The ref found last is kept beside the map: a Get after a Set, a Delete, a
// Clear or a reset of that ref answers what the map holds now. Random
// operations on a few keys, each followed by Gets of every ref, against a
// map[Ref].
func TestRefMapGetAfterChangesOfTheRefFoundLast(t *testing.T) {
	var m RefMap[int]
	want := map[Ref]int{}
	keys := []string{"openai/gpt-4o", "anthropic/claude", "t1"}
	var refs []Ref
	for _, sc := range []Scope{ProviderModel, PromptTemplate, Downstream} {
		for _, k := range keys {
			refs = append(refs, Ref{sc, k})
		}
	}
	seed := uint64(1)
	next := func(n int) int { // a fixed sequence: xorshift
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	for i := range 5000 {
		ref := refs[next(len(refs))]
		m.Get(ref) // found last, if it is there
		switch op := next(10); {
		case op < 5:
			m.Set(ref, i)
			want[ref] = i
		case op < 8:
			m.Delete(ref)
			delete(want, ref)
		case op < 9:
			m.Clear()
			clear(want)
		default:
			m.reset()
			clear(want)
		}
		for _, r := range refs {
			got, ok := m.Get(r)
			if v, in := want[r]; ok != in || got != v {
				t.Fatalf("step %d: Get(%v) = %d, %v; want %d, %v", i, r, got, ok, v, in)
			}
		}
	}
}
