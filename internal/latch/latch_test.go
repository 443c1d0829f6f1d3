package latch

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/breaker"
)

var tpl = breaker.Ref{Scope: breaker.PromptTemplate, Key: "refund-v9"}

// rec is one record of the breakers topic as a Book reads it.
type rec struct {
	kind string // open, end, reset, forget
	key  string
	ref  breaker.Ref
}

func apply(b *Book, off int64, r rec) {
	switch r.kind {
	case "open":
		b.Open(r.key, Item{Ref: r.ref, Task: r.key, Offset: off})
	case "end":
		b.End(r.key, off)
	case "reset":
		b.Reset(r.ref, off)
	case "forget":
		b.ForgetReset(r.ref)
	}
}

// Guards the rule of a latch: a breaker is latched exactly while an item of
// it is open whose offset is above its last RESET's; a RESET ends the items
// before it and no later one, whenever it is read.
func TestLatchedByOffsets(t *testing.T) {
	other := breaker.Ref{Scope: breaker.PromptTemplate, Key: "summary-v1"}
	for _, tc := range []struct {
		name string
		log  []rec
		want bool
	}{
		{"no item", nil, false},
		{"one open item", []rec{{"open", "a", tpl}}, true},
		{"item decided", []rec{{"open", "a", tpl}, {"end", "a", tpl}}, false},
		{"reset after the item", []rec{{"open", "a", tpl}, {"reset", "", tpl}}, false},
		{"item after the reset", []rec{{"reset", "", tpl}, {"open", "a", tpl}}, true},
		{"late reset keeps a newer item", []rec{{"open", "a", tpl}, {"reset", "", tpl}, {"open", "b", tpl}}, true},
		{"newer item decided", []rec{{"open", "a", tpl}, {"reset", "", tpl}, {"open", "b", tpl}, {"end", "b", tpl}}, false},
		{"an item written again after a reset", []rec{{"open", "a", tpl}, {"reset", "", tpl}, {"open", "a", tpl}}, true},
		{"another breaker's item", []rec{{"open", "a", other}}, false},
		{"another breaker's reset", []rec{{"open", "a", tpl}, {"reset", "", other}}, true},
		{"one of two decided", []rec{{"open", "a", tpl}, {"open", "b", tpl}, {"end", "a", tpl}}, true},
		{"reset forgotten once nothing before it is open", []rec{{"open", "a", tpl}, {"reset", "", tpl}, {"end", "a", tpl}, {"forget", "", tpl}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			for i, r := range tc.log {
				apply(b, int64(i), r)
			}
			if got := b.Latched(tpl); got != tc.want {
				t.Fatalf("latched %v, want %v (holding %v)", got, tc.want, b.Holding(tpl))
			}
			if got := len(b.Holding(tpl)) > 0; got != tc.want {
				t.Fatalf("holding %v, want latched %v", b.Holding(tpl), tc.want)
			}
		})
	}
}

// Guards what compaction keeps: a Book that reads only the latest record
// of every key (what a cleaned topic holds, tombstones gone or not) has the
// latches of a Book that read the whole log, and a log read twice (a reader
// that started over) changes none.
func TestCompactedLogHasTheSameLatches(t *testing.T) {
	refs := []breaker.Ref{tpl, {Scope: breaker.PromptTemplate, Key: "b"}, {Scope: breaker.ProviderModel, Key: "acme/m"}}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 3))
		type logged struct {
			off int64
			rec
		}
		var log []logged
		for off := range int64(60) {
			ref := refs[rng.IntN(len(refs))]
			r := rec{ref: ref}
			switch n := rng.IntN(10); {
			case n < 5:
				r.kind, r.key = "open", fmt.Sprintf("item/%s/%d", ref, rng.IntN(5))
			case n < 8:
				r.kind, r.key = "end", fmt.Sprintf("item/%s/%d", ref, rng.IntN(5))
			default:
				r.kind, r.key = "reset", "reset/"+ref.String()
			}
			log = append(log, logged{off, r})
		}
		whole, twice, compacted := New(), New(), New()
		for _, l := range log {
			apply(whole, l.off, l.rec)
			apply(twice, l.off, l.rec)
		}
		for _, l := range log {
			apply(twice, l.off, l.rec)
		}
		last := map[string]logged{}
		for _, l := range log {
			last[l.key] = l
		}
		kept := slices.Collect(func(yield func(logged) bool) {
			for _, l := range last {
				if l.kind == "end" && rng.IntN(2) == 0 {
					continue // the tombstone cleaned too
				}
				if !yield(l) {
					return
				}
			}
		})
		slices.SortFunc(kept, func(x, y logged) int { return int(x.off - y.off) })
		for _, l := range kept {
			apply(compacted, l.off, l.rec)
		}
		for _, ref := range refs {
			w, c, tw := whole.Latched(ref), compacted.Latched(ref), twice.Latched(ref)
			if w != c || w != tw {
				t.Fatalf("seed %d, %s: latched %v reading the whole log, %v reading it compacted, %v reading it twice", seed, ref, w, c, tw)
			}
		}
	}
}

// Guards the hygiene of the topic: the items a RESET ended are listed for
// their tombstones, and the RESET is obsolete once they are gone.
func TestEndedItemsAndObsoleteResets(t *testing.T) {
	b := New()
	b.Open("item/a", Item{Ref: tpl, Task: "a", Offset: 1})
	b.Open("item/b", Item{Ref: tpl, Task: "b", Offset: 2})
	b.Reset(tpl, 3)
	b.Open("item/c", Item{Ref: tpl, Task: "c", Offset: 4})
	if got := b.Ended(tpl); !slices.Equal(got, []string{"item/a", "item/b"}) {
		t.Fatalf("ended %v, want item/a, item/b", got)
	}
	if b.Obsolete(tpl) {
		t.Fatal("a RESET is obsolete while items before it are open")
	}
	b.End("item/a", 5)
	b.End("item/b", 6)
	if !b.Obsolete(tpl) || !b.Latched(tpl) {
		t.Fatalf("obsolete %v latched %v, want the RESET obsolete and item c holding", b.Obsolete(tpl), b.Latched(tpl))
	}
	b.ForgetReset(tpl)
	if !b.Latched(tpl) {
		t.Fatal("forgetting an obsolete RESET released item c")
	}
	b.End("item/c", 7)
	if items, resets := b.Len(); items != 0 || resets != 0 || b.Latched(tpl) {
		t.Fatalf("%d items and %d resets left, latched %v: want none", items, resets, b.Latched(tpl))
	}
}

// Guards an earlier release's item read after this release's tombstone of
// it: the earlier release wrote items by key to partitions other than 0,
// whose offsets a reader orders before partition 0's; a reader fetches the
// partitions independently and may read the item's open record (from
// partition 2) after the tombstone of its decision (partition 0). The item
// stays ended: the template is not latched, and the tombstone of a RESET
// read later does not bring the item back. An item written after the
// tombstone (a new hallucination of the task) still holds.
func TestAnEarlierReleasesItemReadAfterItsTombstoneStaysEnded(t *testing.T) {
	const legacy = int64(1) << 62
	b := New()
	b.End("item-1", 87)                                                // partition 0: the decision
	b.Open("item-1", Item{Ref: tpl, Task: "t-1", Offset: 23 - legacy}) // partition 2: the item, read after
	if b.Latched(tpl) || len(b.Holding(tpl)) != 0 {
		t.Fatalf("latched by an item whose tombstone was read before it: %v", b.Holding(tpl))
	}
	b.Reset(tpl, 182)
	b.ForgetReset(tpl)
	if b.Latched(tpl) {
		t.Fatalf("latched again once the RESET was forgotten: %v", b.Holding(tpl))
	}
	if items, _ := b.Len(); items != 0 {
		t.Fatalf("%d items open, want none", items)
	}
	// the same key opened again after its tombstone: a newer item, it holds
	b.Open("item-1", Item{Ref: tpl, Task: "t-1", Offset: 300})
	if !b.Latched(tpl) {
		t.Fatal("an item written after the tombstone does not latch")
	}
	// an earlier release's tombstone (its place among partition 0's
	// offsets unknown) ends the item it finds, and keeps nothing
	b.End("item-2", math.MaxInt64)
	b.Open("item-2", Item{Ref: tpl, Task: "t-2", Offset: 400})
	if len(b.Holding(tpl)) != 2 {
		t.Fatalf("holding %v, want item-1 and item-2", b.Holding(tpl))
	}
}
