package router

import (
	"fmt"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// assign runs a balancer over n members consuming ingress and decisions with
// the given partition counts and returns each member's assignment.
func assign(t *testing.T, bal kgo.GroupBalancer, n int, ingress, decisions int32) map[string]map[string][]int32 {
	t.Helper()
	var members []kmsg.JoinGroupResponseMember
	for i := range n {
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID = fmt.Sprintf("m%d", i)
		m.ProtocolMetadata = bal.JoinGroupMetadata([]string{"decisions", "ingress"}, nil, 1)
		members = append(members, m)
	}
	mb, _, err := bal.MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	cb := mb.(*kgo.ConsumerBalancer)
	plan, err := cb.BalanceOrError(map[string]int32{"ingress": ingress, "decisions": decisions})
	if err != nil {
		t.Fatal(err)
	}
	return plan.(*kgo.BalancePlan).AsMemberIDMap()
}

// Guards that partition p of ingress and of decisions go to the same
// instance whatever the topics' partition counts (one topic's partitions are
// added before the other's): under the range assignor three members would
// get ingress 1 and decisions 1 apart, and two instances would route the
// tasks of partition 1 against different stores. Every partition of each
// topic is assigned exactly once; with equal counts the assignment is the
// range assignor's.
func TestCopartitionedAssignment(t *testing.T) {
	for _, tc := range []struct {
		members            int
		ingress, decisions int32
	}{{3, 4, 3}, {3, 3, 4}, {2, 6, 3}, {4, 3, 3}, {3, 6, 6}, {1, 5, 3}} {
		t.Run(fmt.Sprintf("%d members, ingress %d, decisions %d", tc.members, tc.ingress, tc.decisions), func(t *testing.T) {
			got := assign(t, copartitionedBalancer(), tc.members, tc.ingress, tc.decisions)
			owner := map[string]map[int32]string{"ingress": {}, "decisions": {}}
			for m, topics := range got {
				for topic, ps := range topics {
					for _, p := range ps {
						if o, dup := owner[topic][p]; dup {
							t.Fatalf("%s partition %d assigned to %s and %s", topic, p, o, m)
						}
						owner[topic][p] = m
					}
				}
			}
			for topic, n := range map[string]int32{"ingress": tc.ingress, "decisions": tc.decisions} {
				if int32(len(owner[topic])) != n {
					t.Fatalf("%d of %d partitions of %s assigned: %v", len(owner[topic]), n, topic, got)
				}
			}
			for p := range min(tc.ingress, tc.decisions) {
				if owner["ingress"][p] != owner["decisions"][p] {
					t.Errorf("partition %d: ingress to %s, decisions to %s", p, owner["ingress"][p], owner["decisions"][p])
				}
			}
			if tc.ingress == tc.decisions {
				want := assign(t, kgo.RangeBalancer(), tc.members, tc.ingress, tc.decisions)
				for m := range want {
					for topic := range want[m] {
						if !slices.Equal(want[m][topic], got[m][topic]) {
							t.Errorf("equal counts: %s gets %s %v, the range assignor %v", m, topic, got[m][topic], want[m][topic])
						}
					}
				}
			}
		})
	}
}
