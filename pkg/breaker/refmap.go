package breaker

import "maps"

// RefMap is a map keyed by Ref, kept as one string-keyed map per scope. A
// router looks its breakers up several times for every event it decides; a
// map[Ref] hashes the whole struct at each look-up, where a string-keyed map
// hashes the key alone and, while it holds eight keys or fewer, compares
// them without hashing. The ref found last in each scope is kept beside the
// map: an event's breakers are looked up several times in a row, and a
// look-up of the same key again compares it and hashes nothing. Its zero
// value is an empty map ready to use. It is not safe for concurrent use.
type RefMap[V any] struct {
	by   [3]map[string]V // indexed by Scope
	last [3]lastRef[V]   // the ref found last, per scope
	// other holds the refs of a scope beyond the three: none come from a
	// policy, but a Ref is a value anyone can build
	other map[Ref]V
	n     int
}

// lastRef is a key of one scope found in the map, and its value.
type lastRef[V any] struct {
	key string
	v   V
	ok  bool
}

// Get returns the value of ref, and whether there is one.
func (m *RefMap[V]) Get(ref Ref) (V, bool) {
	if int(ref.Scope) < len(m.by) {
		l := &m.last[ref.Scope]
		if l.ok && l.key == ref.Key {
			return l.v, true
		}
		v, ok := m.by[ref.Scope][ref.Key]
		if ok {
			*l = lastRef[V]{key: ref.Key, v: v, ok: true}
		}
		return v, ok
	}
	v, ok := m.other[ref]
	return v, ok
}

// Set sets the value of ref.
func (m *RefMap[V]) Set(ref Ref, v V) {
	if int(ref.Scope) < len(m.by) {
		mm := m.by[ref.Scope]
		if mm == nil {
			mm = map[string]V{}
			m.by[ref.Scope] = mm
		}
		n := len(mm)
		mm[ref.Key] = v
		m.n += len(mm) - n
		if l := &m.last[ref.Scope]; l.ok && l.key == ref.Key {
			l.v = v
		}
		return
	}
	if m.other == nil {
		m.other = map[Ref]V{}
	}
	n := len(m.other)
	m.other[ref] = v
	m.n += len(m.other) - n
}

// Delete removes ref.
func (m *RefMap[V]) Delete(ref Ref) {
	if int(ref.Scope) < len(m.by) {
		mm := m.by[ref.Scope]
		n := len(mm)
		delete(mm, ref.Key)
		m.n -= n - len(mm)
		if l := &m.last[ref.Scope]; l.ok && l.key == ref.Key {
			*l = lastRef[V]{}
		}
		return
	}
	n := len(m.other)
	delete(m.other, ref)
	m.n -= n - len(m.other)
}

// Len is the number of refs in the map.
func (m *RefMap[V]) Len() int { return m.n }

// All yields every ref and its value, in no order. Deleting the ref
// yielded, or one already yielded, is allowed meanwhile, as for a map.
func (m *RefMap[V]) All(yield func(Ref, V) bool) {
	for sc, mm := range m.by {
		for k, v := range mm {
			if !yield(Ref{Scope: Scope(sc), Key: k}, v) {
				return
			}
		}
	}
	for ref, v := range m.other {
		if !yield(ref, v) {
			return
		}
	}
}

// Clear removes every ref, keeping the maps' room.
func (m *RefMap[V]) Clear() {
	for _, mm := range m.by {
		clear(mm)
	}
	clear(m.other)
	m.n = 0
	m.last = [3]lastRef[V]{}
}

// reset empties the map for its next use: small maps are cleared and
// kept, large ones let go (clearing a map costs its room, not its length).
func (m *RefMap[V]) reset() {
	if m.n > 64 {
		*m = RefMap[V]{}
		return
	}
	m.Clear()
}

// Clone returns a copy of the map.
func (m *RefMap[V]) Clone() RefMap[V] {
	c := RefMap[V]{n: m.n}
	for sc, mm := range m.by {
		if mm != nil {
			c.by[sc] = maps.Clone(mm)
		}
	}
	if m.other != nil {
		c.other = maps.Clone(m.other)
	}
	return c
}
