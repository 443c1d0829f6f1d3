// Package latch keeps the latches of circuit breakers in the order the
// breakers topic gives them, and nothing else: no writer's clock is read.
//
// A breaker is latched (held OPEN until a person acts) exactly while one of
// its items is open whose record's offset is above the offset of the
// breaker's last RESET record. An item is a record of one reason to hold the
// breaker: a hallucination's review item (keyed per task), or a person's
// latch by hand. Its tombstone ends it (the item was decided). A RESET ends
// every item written before it (lower offsets) and no later one. The topic has
// one partition, so its offsets order every record of every breaker.
//
// Compaction keeps the latest record of every key: an item's latest record
// (open, with its offset, or its tombstone until the tombstone itself is
// cleaned) and a breaker's last RESET. That is all a Book reads, so a
// compacted topic gives the same latches as the whole log. What compaction may
// remove (an item's earlier records, earlier RESETs, the failure-rate states
// of other keys) never changes a latch.
//
// A Book is not safe for concurrent use.
package latch

import (
	"cmp"
	"math"
	"slices"

	"github.com/faultrouter/faultrouter/pkg/breaker"
)

// Item is one open item: its record's key, the breaker it holds, its task
// (or, for a latch by hand, a name for it), the offset of its record and the
// instance or person that wrote it.
type Item struct {
	Key    string // its record's key
	Ref    breaker.Ref
	Task   string
	Offset int64
	Writer string
}

// Book is the latches read from the breakers topic so far.
type Book struct {
	items  map[string]Item                 // open items by record key
	byRef  map[breaker.Ref]map[string]bool // the keys of each breaker's open items
	resets map[breaker.Ref]int64           // the offset of each breaker's last RESET
	above  map[breaker.Ref]int             // how many open items of each breaker are above its last RESET
	dirty  map[breaker.Ref]bool            // breakers whose latch may have changed since Dirty
	// ended holds the offset of each tombstone read while no item was open
	// under its key: an item record of a lower offset read after it stays
	// ended (Open)
	ended map[string]int64
}

// New returns an empty Book.
func New() *Book {
	return &Book{items: map[string]Item{}, byRef: map[breaker.Ref]map[string]bool{},
		resets: map[breaker.Ref]int64{}, above: map[breaker.Ref]int{}, dirty: map[breaker.Ref]bool{}, ended: map[string]int64{}}
}

// Open applies an item record under key. A record read again (a reader that
// starts over) changes nothing: offsets only grow. Nor does one whose key's
// tombstone, at a higher offset, was read before it: a reader of several
// partitions (an earlier release wrote items by key to partitions other than
// 0, their offsets ordered before partition 0's) may read an item's open
// record after the tombstone this release wrote on partition 0.
func (b *Book) Open(key string, it Item) {
	if end, ok := b.ended[key]; ok {
		if end >= it.Offset {
			return
		}
		delete(b.ended, key) // a newer item under the key
	}
	if old, ok := b.items[key]; ok {
		if old.Offset >= it.Offset {
			return
		}
		b.remove(key, old)
	}
	b.items[key] = it
	keys := b.byRef[it.Ref]
	if keys == nil {
		keys = map[string]bool{}
		b.byRef[it.Ref] = keys
	}
	keys[key] = true
	if b.isAbove(it) {
		b.above[it.Ref]++
	}
	b.dirty[it.Ref] = true
}

// End applies the tombstone of the item under key at offset, and returns
// the breaker it held (ok false: no such item was open). A tombstone that
// finds no item open is kept, so that the item's record read later, at a
// lower offset, stays ended; math.MaxInt64, a tombstone whose place among
// partition 0's offsets is unknown (an earlier release's, on the item's own
// partition, which orders the two), is not. Those kept are what a restore
// reads of a compacted topic (tombstones whose items the cleaner removed)
// and a second tombstone of an item: no more than the topic holds.
func (b *Book) End(key string, offset int64) (breaker.Ref, bool) {
	it, ok := b.items[key]
	if !ok || it.Offset > offset {
		if cur, kept := b.ended[key]; !ok && offset < math.MaxInt64 && (!kept || offset > cur) {
			b.ended[key] = offset
		}
		return breaker.Ref{}, false
	}
	b.remove(key, it)
	b.dirty[it.Ref] = true
	return it.Ref, true
}

func (b *Book) remove(key string, it Item) {
	delete(b.items, key)
	if keys := b.byRef[it.Ref]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(b.byRef, it.Ref)
		}
	}
	if b.isAbove(it) {
		if b.above[it.Ref]--; b.above[it.Ref] <= 0 {
			delete(b.above, it.Ref)
		}
	}
}

func (b *Book) isAbove(it Item) bool {
	r, ok := b.resets[it.Ref]
	return !ok || it.Offset > r
}

// Reset applies a RESET record of ref at offset: the items written before
// it no longer hold the breaker.
func (b *Book) Reset(ref breaker.Ref, offset int64) {
	if r, ok := b.resets[ref]; ok && r >= offset {
		return
	}
	b.resets[ref] = offset
	n := 0
	for key := range b.byRef[ref] {
		if b.items[key].Offset > offset {
			n++
		}
	}
	if n == 0 {
		delete(b.above, ref)
	} else {
		b.above[ref] = n
	}
	b.dirty[ref] = true
}

// ForgetReset applies the tombstone of ref's RESET record: written once no
// item of ref written before the RESET is open (Obsolete), it changes no
// latch.
func (b *Book) ForgetReset(ref breaker.Ref) {
	if _, ok := b.resets[ref]; !ok {
		return
	}
	delete(b.resets, ref)
	n := len(b.byRef[ref])
	if n == 0 {
		delete(b.above, ref)
	} else {
		b.above[ref] = n
	}
	b.dirty[ref] = true
}

// ResetOffset returns the offset of ref's last RESET.
func (b *Book) ResetOffset(ref breaker.Ref) (int64, bool) {
	r, ok := b.resets[ref]
	return r, ok
}

// Latched reports whether ref is latched: an item of it is open above its
// last RESET.
func (b *Book) Latched(ref breaker.Ref) bool { return b.above[ref] > 0 }

// Holding returns the open items of ref above its last RESET, in the order
// written: what holds it latched.
func (b *Book) Holding(ref breaker.Ref) []Item {
	var out []Item
	for key := range b.byRef[ref] {
		if it := b.items[key]; b.isAbove(it) {
			out = append(out, it)
		}
	}
	slices.SortFunc(out, func(x, y Item) int { return cmp.Compare(x.Offset, y.Offset) })
	return out
}

// Item returns the open item under key.
func (b *Book) Item(key string) (Item, bool) {
	it, ok := b.items[key]
	return it, ok
}

// HasItem reports whether the item of record key key is open, key given as
// bytes (a lookup that builds no string).
func (b *Book) HasItem(key []byte) bool {
	_, ok := b.items[string(key)]
	return ok
}

// Ended returns the record keys of the items of ref still open on the topic
// that its last RESET ended: their tombstones change no latch and let the
// RESET go too.
func (b *Book) Ended(ref breaker.Ref) []string {
	r, ok := b.resets[ref]
	if !ok {
		return nil
	}
	var out []string
	for key := range b.byRef[ref] {
		if b.items[key].Offset <= r {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// Obsolete reports whether ref has a RESET record that no open item needs:
// none written before it is open. Its tombstone then changes nothing.
func (b *Book) Obsolete(ref breaker.Ref) bool {
	r, ok := b.resets[ref]
	if !ok {
		return false
	}
	for key := range b.byRef[ref] {
		if b.items[key].Offset <= r {
			return false
		}
	}
	return true
}

// MarkDirty adds ref to the breakers Dirty returns.
func (b *Book) MarkDirty(ref breaker.Ref) { b.dirty[ref] = true }

// Dirty returns the breakers whose latch may have changed since the last
// call, and forgets them.
func (b *Book) Dirty() []breaker.Ref {
	if len(b.dirty) == 0 {
		return nil
	}
	out := make([]breaker.Ref, 0, len(b.dirty))
	for ref := range b.dirty {
		out = append(out, ref)
	}
	clear(b.dirty)
	slices.SortFunc(out, func(x, y breaker.Ref) int {
		return cmp.Or(cmp.Compare(x.Scope, y.Scope), cmp.Compare(x.Key, y.Key))
	})
	return out
}

// Len returns the open items and RESET records the Book holds: what the
// breakers topic keeps live of latches.
func (b *Book) Len() (items, resets int) { return len(b.items), len(b.resets) }
