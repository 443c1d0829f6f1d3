package router

// latchitems.go keeps the open review items of the hallucinations that
// latched a prompt template's breaker: a template stays latched until every
// such item is decided, or a person resets the breaker by hand. An item opens
// when a hallucination is decided (on the instance that owns its task) and
// closes when a reviewer's decision of it is routed (on the instance that
// owns the task then). Both are records on the breakers topic, in the
// batch's transaction (an open item's event.BreakerItem, a tombstone once
// decided), so every instance, and one that starts later, knows every open
// item: deciding an item reopens the template only when no other item of it
// is open, wherever that item's task is routed.
//
// An item whose task no longer has it open without a decision (an operator
// re-drove the task, which clears its review item) is tombstoned when that
// event is routed: it no longer holds the template, nor reopens it.
//
// A person's reset by hand (a RESET command) releases the items open then:
// every instance that applies it writes the tombstones of the items it knows
// opened before it, so they no longer hold the template (a later
// hallucination latches it again, with its own item). Two instances that each decide the last item they know of in the same
// commit interval while the other opens a new one may reopen the template
// with that new item open: it is held again by the item's next
// hallucination, or a person.

import (
	"slices"

	"github.com/faultrouter/faultrouter/pkg/breaker"
)

// latchItem is one open item: the breaker it holds and when it opened.
type latchItem struct {
	ref      breaker.Ref
	task     string
	openedAt int64 // Unix ms
}

// latchItems are the open items by record key, with an undo log for the
// batch's own changes (a batch that does not commit is consumed again and
// makes them again).
type latchItems struct {
	open map[string]latchItem
	// undo holds, between begin and commit or rollback, each key changed by
	// the batch as it was at begin (ok false: absent)
	undo map[string]savedItem
}

type savedItem struct {
	it latchItem
	ok bool
}

func newLatchItems() *latchItems { return &latchItems{open: map[string]latchItem{}} }

func (l *latchItems) begin()  { l.undo = map[string]savedItem{} }
func (l *latchItems) commit() { l.undo = nil }

func (l *latchItems) rollback() {
	for k, s := range l.undo {
		if s.ok {
			l.open[k] = s.it
		} else {
			delete(l.open, k)
		}
	}
	l.undo = nil
}

func (l *latchItems) save(key string) {
	if l.undo == nil {
		return
	}
	if _, done := l.undo[key]; !done {
		it, ok := l.open[key]
		l.undo[key] = savedItem{it, ok}
	}
}

// put records an open item under its record key.
func (l *latchItems) put(key string, it latchItem) {
	l.save(key)
	l.open[key] = it
}

// del records that the item under key is decided.
func (l *latchItems) del(key string) {
	if _, ok := l.open[key]; !ok {
		return
	}
	l.save(key)
	delete(l.open, key)
}

// adopt applies an item another instance wrote (nil: it decided it). It is
// not undone with the batch: another instance's change is a fact whatever
// this batch's fate.
func (l *latchItems) adopt(key string, it *latchItem) {
	if it == nil {
		delete(l.open, key)
	} else {
		l.open[key] = *it
	}
	if l.undo != nil {
		delete(l.undo, key)
	}
}

// has reports whether the item under key is open.
func (l *latchItems) has(key string) bool {
	_, ok := l.open[key]
	return ok
}

// holding returns the tasks of the open items of ref, other than task's
// own: what keeps the template latched once that task's item is decided.
func (l *latchItems) holding(ref breaker.Ref, task string) []string {
	var out []string
	for _, it := range l.open {
		if it.ref == ref && it.task != task {
			out = append(out, it.task)
		}
	}
	slices.Sort(out)
	return out
}

// openedBy returns the tasks of the open items of ref that opened at or
// before until (Unix ms): the items a person's reset at that time releases.
func (l *latchItems) openedBy(ref breaker.Ref, until int64) []string {
	var out []string
	for _, it := range l.open {
		if it.ref == ref && it.openedAt <= until {
			out = append(out, it.task)
		}
	}
	slices.Sort(out)
	return out
}
