package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// passthrough is the ceiling the router is measured against: a transactional
// consumer-producer that does no work. It consumes the backlog in a consumer
// group with read_committed and, in one transaction per poll, copies each
// record to three output topics (as the router writes an audit record, a
// state record and often a routed record per input) and commits the consumed
// offsets. A poll takes up to perPoll records (the router's poll size), or,
// with perPoll 0, whatever the client has buffered: one fetch response per
// broker, franz-go's default fetch bounds. It returns the records copied per
// second, from the partition assignment to the commit of the last record,
// and the mean records per transaction.
func passthrough(ctx context.Context, seeds []kgo.Opt, from string, outs [3]string, group string, n, perPoll int) (perSec, perTxn float64, err error) {
	var assignedAt atomic.Int64
	opts := append([]kgo.Opt{}, seeds...)
	opts = append(opts,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(from),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.TransactionalID(group+"-0"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.ProducerBatchMaxBytes(1<<20),
		// the router's default (--compression none): the two write alike
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			assignedAt.CompareAndSwap(0, time.Now().UnixNano())
		}),
	)
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return 0, 0, err
	}
	defer sess.Close()
	if _, _, err := sess.Client().ProducerID(ctx); err != nil {
		return 0, 0, fmt.Errorf("passthrough: init producer: %w", err)
	}
	done, txns := 0, 0
	for done < n {
		var fetches kgo.Fetches
		if perPoll > 0 {
			fetches = sess.PollRecords(ctx, perPoll)
		} else {
			fetches = sess.PollFetches(ctx)
		}
		if err := ctx.Err(); err != nil {
			return 0, 0, fmt.Errorf("passthrough: copied %d of %d: %w", done, n, err)
		}
		if fetches.IsClientClosed() {
			return 0, 0, errors.New("passthrough: client closed")
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return 0, 0, err
		}
		var (
			mu      sync.Mutex
			prodErr error
		)
		fetches.EachRecord(func(r *kgo.Record) {
			for _, topic := range outs {
				out := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value}
				sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						prodErr = errors.Join(prodErr, err)
						mu.Unlock()
					}
				})
			}
		})
		if err := sess.Client().Flush(ctx); err != nil {
			return 0, 0, err
		}
		if prodErr != nil {
			return 0, 0, fmt.Errorf("passthrough: produce: %w", prodErr)
		}
		committed, err := sess.End(ctx, kgo.TryCommit)
		if err != nil {
			return 0, 0, fmt.Errorf("passthrough: end transaction: %w", err)
		}
		if committed {
			done += fetches.NumRecords()
			txns++
		}

	}
	return float64(n) / time.Since(time.Unix(0, assignedAt.Load())).Seconds(), float64(done) / float64(txns), nil
}
