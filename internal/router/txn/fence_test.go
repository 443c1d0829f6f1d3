package txn

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Guards the fence's generation check: a transaction that commits in
// another group generation than the one the owned partitions were assigned
// in fails its offset commit with ILLEGAL_GENERATION, which franz-go aborts
// on (an instance that missed a revoke writes no state of the partitions it
// lost); one of the same generation, or of an instance that owns nothing,
// goes through.
func TestFenceAbortsAnotherGeneration(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics := []string{"ingress", "decisions"}
	req := func(gen int32) *kmsg.TxnOffsetCommitRequest {
		q := kmsg.NewPtrTxnOffsetCommitRequest()
		q.Generation = gen
		return q
	}
	if err := Fence(owns([]int32{0, 2}, 5), topics, cl)(req(6)); !errors.Is(err, kerr.IllegalGeneration) {
		t.Errorf("a commit in generation 6 of partitions owned since generation 5: %v, want ILLEGAL_GENERATION", err)
	}
	if err := Fence(owns([]int32{0, 2}, 5), topics, cl)(req(5)); err != nil {
		t.Errorf("a commit in the owned partitions' generation: %v, want none", err)
	}
	if err := Fence(owns(nil, -1), topics, cl)(req(6)); err != nil {
		t.Errorf("a commit of an instance that owns nothing: %v, want none", err)
	}
}

// owns is a Fence owner that owns the partitions owned since generation gen.
func owns(owned []int32, gen int32) func(int32) ([]int32, int32) {
	return func(int32) ([]int32, int32) { return owned, gen }
}
