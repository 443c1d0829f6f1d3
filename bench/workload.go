package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	mix "github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// workload produces the events of tasks [first, first+tasks) with the prefix
// name, attempt by attempt in windows of 500 tasks: all first attempts of a
// window, then its second attempts, then its third, so that most attempts
// find their task's state in the store rather than in the same poll.
type workload struct {
	codec  *codec.Codec
	topic  string
	prefix string
	seed   uint64
}

// event builds attempt n of task i (internal/workload).
func (w *workload) event(i, n int, at time.Time) event.TaskEvent {
	return mix.Event(w.prefix, w.seed, i, n, at)
}

// produce writes attempts [1..attempts] of tasks [first, first+tasks) to the
// topic, as fast as the broker takes them, and returns the record count.
func (w *workload) produce(ctx context.Context, cl *kgo.Client, first, tasks, attempts int) (int, error) {
	const window = 500
	var (
		mu       sync.Mutex
		firstErr error
		n        int
	)
	at := time.Now()
	for lo := first; lo < first+tasks; lo += window {
		hi := min(lo+window, first+tasks)
		for a := 1; a <= attempts; a++ {
			for i := lo; i < hi; i++ {
				rec, err := w.record(i, a, at.Add(time.Duration(a)*1500*time.Millisecond))
				if err != nil {
					return n, err
				}
				n++
				cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
					}
				})
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return n, err
	}
	return n, firstErr
}

func (w *workload) record(i, n int, at time.Time) (*kgo.Record, error) {
	e := w.event(i, n, at)
	v, err := w.codec.EncodeTaskEvent(nil, &e)
	if err != nil {
		return nil, fmt.Errorf("bench: encode %s: %w", e.TaskID, err)
	}
	return &kgo.Record{Topic: w.topic, Key: []byte(e.TaskID), Value: v}, nil
}
