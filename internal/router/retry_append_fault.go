//go:build checkerfault

package router

import (
	"slices"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// This file is a deliberately broken router, built only with the
// checkerfault tag by the reference-model checker's self-test
// (integration/checker_selftest_test.go): it publishes one due retry in 500
// twice, the first one included. Never build a release with this tag.

var retriesQueued atomic.Int64

func appendRetry(out []*kgo.Record, rec *kgo.Record) []*kgo.Record {
	out = append(out, rec)
	if retriesQueued.Add(1)%500 == 1 {
		dup := *rec
		dup.Headers = slices.Clone(rec.Headers)
		out = append(out, &dup)
	}
	return out
}
