package breaker

// surge.go detects surges: one failure class rising for one prompt template
// or provider/model (MODEL_REFUSAL after a prompt change). Like the breakers
// it is a pure state machine over a bucketed rolling window: it does no I/O,
// reads no clock, and returns each surge as a value for the caller to
// publish.

import (
	"fmt"
	"slices"
	"time"
)

// SurgeConfig is the rolling window and threshold of the surge detector.
type SurgeConfig struct {
	// Window is the rolling window events are counted in. Must be > 0.
	Window time.Duration
	// MinEvents is the fewest events of one class in the window before it
	// may be a surge. Must be >= 1.
	MinEvents int32
	// Ratio makes a surge when events of the class / all events of the key
	// >= it, within the window. In (0, 1].
	Ratio float64
	// Classes are the watched classes. Empty watches nothing.
	Classes []string
	// Scopes are the watched scopes; events of other scopes are ignored.
	Scopes []Scope
}

// Validate names the first bad field.
func (c SurgeConfig) Validate() error {
	switch {
	case c.Window <= 0:
		return fmt.Errorf("breaker: surge Window: must be > 0, got %s", c.Window)
	case c.MinEvents < 1:
		return fmt.Errorf("breaker: surge MinEvents: must be >= 1, got %d", c.MinEvents)
	case !(c.Ratio > 0 && c.Ratio <= 1):
		return fmt.Errorf("breaker: surge Ratio: must be in (0, 1], got %v", c.Ratio)
	}
	for _, sc := range c.Scopes {
		if !slices.Contains(Scopes, sc) {
			return fmt.Errorf("breaker: surge Scopes: must be of %v, got %s", Scopes, sc)
		}
	}
	return nil
}

// Surge is one class rising for one key: the detector's alert.
type Surge struct {
	Ref
	Class string
	// Count and Total are the class's events and all events of the key in
	// the window when it fired.
	Count, Total int32
	// Reason names the key and the numbers.
	Reason string
	// TaskID is the task whose event made it fire.
	TaskID string
	At     time.Time
}

type surgeSlot struct {
	start int64   // slot start, ms; 0 for unused
	total int32   // every event of the key
	class []int32 // events per watched class, indexed like SurgeConfig.Classes
}

// surgeKey is one key's window and, per watched class, whether it has fired
// and not yet re-armed.
type surgeKey struct {
	window [buckets]surgeSlot
	fired  []bool
	saved  uint64 // the unit of changes (Surges.epoch) it was saved in
}

// Surges is the surge detector. It fires once when, within the window, a
// watched class has at least MinEvents events of a key and they are at least
// Ratio of all that key's events; it re-arms when that ratio falls below
// Ratio again or the key's window empties, so one surge raises one alert.
// It is not safe for concurrent use, and lives in memory only, like a Set.
type Surges struct {
	cfg   SurgeConfig
	index map[string]int // class -> index in cfg.Classes
	keys  RefMap[*surgeKey]
	undo  RefMap[*surgeKey] // like Set's: each key changed since Begin, as it was
	unit  bool
	epoch uint64
}

// Begin, Commit and Rollback make a unit of changes, as for a Set.
func (s *Surges) Begin() { s.undo.reset(); s.unit, s.epoch = true, s.epoch+1 }

// Commit keeps the changes made since Begin.
func (s *Surges) Commit() { s.undo.reset(); s.unit = false }

// Rollback undoes the changes made since Begin.
func (s *Surges) Rollback() {
	for ref, old := range s.undo.All {
		if old == nil {
			s.keys.Delete(ref)
		} else {
			s.keys.Set(ref, old)
		}
	}
	s.undo.reset()
	s.unit = false
}

func (s *Surges) save(ref Ref) {
	if !s.unit {
		return
	}
	k, ok := s.keys.Get(ref)
	if !ok {
		if _, ok := s.undo.Get(ref); !ok {
			s.undo.Set(ref, nil)
		}
		return
	}
	s.saveFound(ref, k)
}

// saveFound is save for k, the key of ref.
func (s *Surges) saveFound(ref Ref, k *surgeKey) {
	if !s.unit || k.saved == s.epoch {
		return
	}
	k.saved = s.epoch
	c := &surgeKey{window: k.window, fired: slices.Clone(k.fired)}
	for i := range c.window {
		c.window[i].class = slices.Clone(k.window[i].class)
	}
	s.undo.Set(ref, c)
}

// NewSurges returns a surge detector.
func NewSurges(cfg SurgeConfig) (*Surges, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Surges{cfg: cfg, index: make(map[string]int, len(cfg.Classes))}
	for i, c := range cfg.Classes {
		s.index[c] = i
	}
	return s, nil
}

// MaxSurgeKeys bounds the keys the detector keeps. At the bound it forgets
// keys with an empty window first, then keys not in a surge, then all: a key
// forgotten during a surge may alert again.
var MaxSurgeKeys = 10_000

// Record counts one decided event of class for ref and returns the surge it
// starts, if any. An event of an unwatched scope is not counted.
func (s *Surges) Record(ref Ref, class, taskID string, now time.Time) (Surge, bool) {
	if !slices.Contains(s.cfg.Scopes, ref.Scope) || len(s.cfg.Classes) == 0 {
		return Surge{}, false
	}
	ms := now.UnixMilli()
	k := s.get(ref, ms)
	if _, total := s.counts(k, -1, ms); total == 0 {
		clear(k.fired) // the window emptied: re-arm
	}
	ci, watched := s.index[class]
	s.count(k, ci, watched, ms)

	_, total := s.counts(k, -1, ms)
	for i := range s.cfg.Classes {
		if !k.fired[i] {
			continue // only a class in a surge is counted again
		}
		if n, _ := s.counts(k, i, ms); float64(n) < s.cfg.Ratio*float64(total) {
			k.fired[i] = false
		}
	}
	if !watched || k.fired[ci] {
		return Surge{}, false
	}
	n, _ := s.counts(k, ci, ms)
	if n < s.cfg.MinEvents || float64(n) < s.cfg.Ratio*float64(total) {
		return Surge{}, false
	}
	k.fired[ci] = true
	return Surge{Ref: ref, Class: class, Count: n, Total: total, TaskID: taskID, At: now,
		Reason: fmt.Sprintf("surge: %d of %d events for %s %s in the last %s are %s (ratio %.2f >= %.2f)",
			n, total, scopeNoun(ref.Scope), ref.Key, shortDuration(s.cfg.Window), class,
			float64(n)/float64(total), s.cfg.Ratio)}, true
}

// Counts sums the window of ref ending at now: the events of class (none
// for a class not watched) and all events of ref. A key never recorded, or
// forgotten, has none.
func (s *Surges) Counts(ref Ref, class string, now time.Time) (n, total int32) {
	k, ok := s.keys.Get(ref)
	if !ok {
		return 0, 0
	}
	ci, watched := s.index[class]
	if !watched {
		ci = -1
	}
	return s.counts(k, ci, now.UnixMilli())
}

// Len returns how many keys the detector keeps.
func (s *Surges) Len() int { return s.keys.Len() }

func (s *Surges) get(ref Ref, now int64) *surgeKey {
	if k, ok := s.keys.Get(ref); ok {
		s.saveFound(ref, k)
		return k
	}
	s.save(ref)
	if s.keys.Len() >= MaxSurgeKeys {
		s.evict(now)
	}
	k := &surgeKey{fired: make([]bool, len(s.cfg.Classes)), saved: s.epoch} // new in this unit: undo forgets it
	s.keys.Set(ref, k)
	return k
}

// evict forgets idle keys; if none is idle, keys not in a surge; if every
// key is in a surge, all of them.
func (s *Surges) evict(now int64) {
	drop := func(forget func(*surgeKey) bool) bool {
		n := s.keys.Len()
		for ref, k := range s.keys.All {
			if forget(k) {
				s.save(ref)
				s.keys.Delete(ref)
			}
		}
		return s.keys.Len() < n
	}
	if drop(func(k *surgeKey) bool { _, total := s.counts(k, -1, now); return total == 0 }) {
		return
	}
	if drop(func(k *surgeKey) bool { return !slices.Contains(k.fired, true) }) {
		return
	}
	for ref := range s.keys.All {
		s.save(ref)
	}
	s.keys.Clear()
}

// counts sums the window ending at now: the events of class index ci (none
// for ci < 0) and all events.
func (s *Surges) counts(k *surgeKey, ci int, now int64) (n, total int32) {
	w := s.cfg.Window.Milliseconds()
	for _, sl := range k.window {
		if sl.start != 0 && sl.start > now-w {
			total += sl.total
			if ci >= 0 {
				n += sl.class[ci]
			}
		}
	}
	return n, total
}

func (s *Surges) count(k *surgeKey, ci int, watched bool, now int64) {
	width := max(s.cfg.Window.Milliseconds()/buckets, 1)
	start := now / width * width
	sl := &k.window[(now/width)%buckets]
	if sl.start != start {
		if sl.class == nil {
			sl.class = make([]int32, len(s.cfg.Classes))
		}
		sl.start, sl.total = start, 0
		clear(sl.class)
	}
	sl.total++
	if watched {
		sl.class[ci]++
	}
}

// scopeNoun names a scope's key in a sentence.
func scopeNoun(sc Scope) string {
	switch sc {
	case ProviderModel:
		return "model"
	case Downstream:
		return "downstream"
	case PromptTemplate:
		return "prompt template"
	}
	return sc.String()
}

// shortDuration prints 5m rather than 5m0s.
func shortDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
