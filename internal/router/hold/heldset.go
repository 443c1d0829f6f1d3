package hold

import (
	"hash/maphash"
	"slices"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/breaker"
)

// heldSet is the set of retries held behind breakers (breakers.go), by task
// ID and by breaker, with an undo log for the batch: a batch that does not
// commit restores it without the set being copied for every batch.
//
// A million tasks can be held at once (every retry of a provider that is
// down), so the set is laid out for memory: about 75 bytes per held retry
// besides its task ID's bytes, where a map by task ID and a map of sets by
// breaker took more than twice that (in make bench's memory run, a million
// tasks, the set's heap fell from 97 to 42 MiB):
//   - the retries are entries of one slice (ents), a removed one's slot
//     reused;
//   - the index by task ID is an open-addressing hash table of slot numbers
//     (linear probing, deletion by backward shift), which keys on the
//     entries' own task IDs: a task ID is held once;
//   - the index by breaker is, per interned breaker (there are few, and
//     many retries held behind each), a slice of the slots held behind it;
//     an entry knows its position in each of its breakers' slices, so a
//     removal swaps the last slot into its place.
//
// The order of a breaker's slice means nothing: releaseHeld sorts what it
// releases by due time. The set shrinks (rebuild) when a batch commits with
// under a quarter of its slots in use.
type heldSet struct {
	ents  []heldRetry // by slot; a free slot has an empty id
	free  []uint32    // free slots
	n     int         // retries held
	table []uint32    // slot+1 by hash of task ID; 0: empty; len a power of two
	seed  maphash.Seed

	byRef [][]uint32 // by interned breaker: the slots held behind it

	// undo holds, per task changed in the batch, its entry before (nil:
	// none); nil outside a batch
	undo map[string]*heldRetry

	refIdx breaker.RefMap[uint32]
	refs   []breaker.Ref
}

// heldRetry is a retry held behind breakers: its task, its task's partition
// and the breakers it would be published into, as indexes into the held
// set's interned breakers (a task names at most one breaker per scope), with
// its position in each one's slice of slots.
type heldRetry struct {
	id        string
	partition int32
	n         uint8
	refs      [maxHeldRefs]uint32
	pos       [maxHeldRefs]uint32
}

// maxHeldRefs is how many breakers one retry can be held behind: one per
// scope (policy.BreakerRefs).
const maxHeldRefs = 3

func newHeldSet() *heldSet {
	return &heldSet{seed: maphash.MakeSeed()}
}

// len is the number of retries held.
func (h *heldSet) len() int { return h.n }

// intern returns the index of ref, adding it when new.
func (h *heldSet) intern(ref breaker.Ref) uint32 {
	if i, ok := h.refIdx.Get(ref); ok {
		return i
	}
	i := uint32(len(h.refs))
	h.refs = append(h.refs, ref)
	h.byRef = append(h.byRef, nil)
	h.refIdx.Set(ref, i)
	return i
}

// get returns the held retry of task id.
func (h *heldSet) get(id string) (heldRetry, bool) {
	if _, s, ok := h.find(id); ok {
		return h.ents[s], true
	}
	return heldRetry{}, false
}

// put holds the retry of task id, of partition p, behind refs (at most
// maxHeldRefs, one per scope; any beyond, and repeats, are not recorded). A
// task without an ID (which has no retry) is not held.
func (h *heldSet) put(id string, p int32, refs []breaker.Ref) {
	if id == "" {
		return
	}
	// an input's task ID shares its decoded record's bytes
	// (codec.DecodeTaskEventInto): a held retry keeps only the ID
	id = strings.Clone(id)
	r := heldRetry{id: id, partition: p}
	for _, ref := range refs {
		i := h.intern(ref)
		if r.n == maxHeldRefs || slices.Contains(r.refs[:r.n], i) {
			continue
		}
		r.refs[r.n] = i
		r.n++
	}
	h.save(id)
	h.unlink(id)
	h.link(r)
}

// anyNot reports whether one of the breakers r is held behind fails ok.
func (h *heldSet) anyNot(r heldRetry, ok func(breaker.Ref) bool) bool {
	for _, i := range r.refs[:r.n] {
		if !ok(h.refs[i]) {
			return true
		}
	}
	return false
}

func (h *heldSet) del(id string) {
	if _, _, ok := h.find(id); !ok {
		return
	}
	h.save(id)
	h.unlink(id)
}

func (h *heldSet) save(id string) {
	if h.undo == nil {
		return
	}
	if _, ok := h.undo[id]; ok {
		return
	}
	var old *heldRetry
	if r, ok := h.get(id); ok {
		old = &r
	}
	h.undo[id] = old
}

// link adds r, whose task is not in the set.
func (h *heldSet) link(r heldRetry) {
	if (h.n+1)*4 > len(h.table)*3 {
		h.resize(max(16, 2*len(h.table)))
	}
	var s uint32
	if k := len(h.free); k > 0 {
		s, h.free = h.free[k-1], h.free[:k-1]
	} else {
		s = uint32(len(h.ents))
		h.ents = append(h.ents, heldRetry{})
	}
	for i, ref := range r.refs[:r.n] {
		r.pos[i] = uint32(len(h.byRef[ref]))
		h.byRef[ref] = append(h.byRef[ref], s)
	}
	h.ents[s] = r
	mask := uint32(len(h.table) - 1)
	i := h.home(r.id) & mask
	for h.table[i] != 0 {
		i = (i + 1) & mask
	}
	h.table[i] = s + 1
	h.n++
}

// unlink removes the retry of task id from the set.
func (h *heldSet) unlink(id string) {
	at, s, ok := h.find(id)
	if !ok {
		return
	}
	r := &h.ents[s]
	for i, ref := range r.refs[:r.n] {
		slots := h.byRef[ref]
		last := slots[len(slots)-1]
		slots[r.pos[i]] = last
		// the moved slot's position in this breaker's slice
		m := &h.ents[last]
		for j := range m.refs[:m.n] {
			if m.refs[j] == ref {
				m.pos[j] = r.pos[i]
			}
		}
		h.byRef[ref] = slots[:len(slots)-1]
	}
	*r = heldRetry{}
	h.free = append(h.free, s)
	h.n--
	// deletion by backward shift: an entry after the hole that may live in
	// it moves there, until an empty cell
	mask := uint32(len(h.table) - 1)
	hole, j := at, at
	for {
		j = (j + 1) & mask
		e := h.table[j]
		if e == 0 {
			break
		}
		k := h.home(h.ents[e-1].id) & mask
		// e stays when its home lies cyclically in (hole, j]
		if (hole <= j && hole < k && k <= j) || (hole > j && (hole < k || k <= j)) {
			continue
		}
		h.table[hole] = e
		hole = j
	}
	h.table[hole] = 0
}

// find returns the table cell and the slot of task id.
func (h *heldSet) find(id string) (cell, slot uint32, ok bool) {
	if h.n == 0 {
		return 0, 0, false
	}
	mask := uint32(len(h.table) - 1)
	for i := h.home(id) & mask; ; i = (i + 1) & mask {
		e := h.table[i]
		if e == 0 {
			return 0, 0, false
		}
		if h.ents[e-1].id == id {
			return i, e - 1, true
		}
	}
}

func (h *heldSet) home(id string) uint32 { return uint32(maphash.String(h.seed, id)) }

// resize rebuilds the table with size cells (a power of two).
func (h *heldSet) resize(size int) {
	h.table = make([]uint32, size)
	mask := uint32(size - 1)
	for s := range h.ents {
		if h.ents[s].id == "" {
			continue
		}
		i := h.home(h.ents[s].id) & mask
		for h.table[i] != 0 {
			i = (i + 1) & mask
		}
		h.table[i] = uint32(s) + 1
	}
}

// behind returns the retries held behind any of refs.
func (h *heldSet) behind(refs map[breaker.Ref]bool) []string {
	var out []string
	seen := map[uint32]bool{}
	for ref := range refs {
		i, ok := h.refIdx.Get(ref)
		if !ok {
			continue
		}
		for _, s := range h.byRef[i] {
			if !seen[s] {
				seen[s] = true
				out = append(out, h.ents[s].id)
			}
		}
	}
	return out
}

// holds reports whether a retry is held behind ref.
func (h *heldSet) holds(ref breaker.Ref) bool {
	i, ok := h.refIdx.Get(ref)
	return ok && len(h.byRef[i]) > 0
}

func (h *heldSet) begin() { h.undo = map[string]*heldRetry{} }

func (h *heldSet) commit() {
	h.undo = nil
	if len(h.ents) >= 4096 && h.n*4 < len(h.ents) || len(h.refs) >= maxIdleRefs && h.liveRefs()*4 < len(h.refs) {
		h.rebuild()
	}
}

// maxIdleRefs bounds the interned breakers: keys come from events, so the
// breakers retries were ever held behind are unbounded over months. Once
// there are this many and fewer than a quarter hold a retry, the set is
// rebuilt with only those that do.
const maxIdleRefs = 1024

// liveRefs is the number of interned breakers a retry is held behind.
func (h *heldSet) liveRefs() int {
	n := 0
	for _, slots := range h.byRef {
		if len(slots) > 0 {
			n++
		}
	}
	return n
}

// keepPartitions lets go of the retries held for tasks of partitions not in
// owned: their new owner holds them from its own store (their states keep
// their moved due times), and a retry held here behind a breaker that stays
// open would otherwise stay in memory for good.
func (h *heldSet) keepPartitions(owned map[int32]bool) {
	if h.n == 0 {
		return
	}
	var drop []string
	for _, r := range h.ents {
		if r.id != "" && !owned[r.partition] {
			drop = append(drop, r.id)
		}
	}
	for _, id := range drop {
		h.del(id)
	}
}

func (h *heldSet) rollback() {
	for id, old := range h.undo {
		h.unlink(id)
		if old != nil {
			h.link(*old)
		}
	}
	h.undo = nil
}

// rebuild lays the set out again in memory sized to the retries it holds,
// with only the breakers they are held behind interned.
func (h *heldSet) rebuild() {
	old, n := h.ents, h.n
	refs := h.refs
	h.ents, h.free, h.n = make([]heldRetry, 0, n), nil, 0
	h.refs, h.byRef, h.refIdx = nil, nil, breaker.RefMap[uint32]{}
	size := 16
	for size*3 < n*4+4 {
		size *= 2
	}
	h.resize(size) // no entries yet: an empty table
	for _, r := range old {
		if r.id != "" {
			for i := range r.refs[:r.n] {
				r.refs[i] = h.intern(refs[r.refs[i]])
			}
			h.link(r)
		}
	}
}
