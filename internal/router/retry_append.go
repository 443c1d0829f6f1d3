//go:build !checkerfault

package router

import "github.com/twmb/franz-go/pkg/kgo"

// appendRetry queues the record of a retry that is due. A build with the
// checkerfault tag replaces it with a broken one (retry_append_fault.go), for
// the reference-model checker's self-test only.
func appendRetry(out []*kgo.Record, rec *kgo.Record) []*kgo.Record { return append(out, rec) }
