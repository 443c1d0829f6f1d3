package router

import (
	"fmt"
	"maps"
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

// coopMember is a member of a simulated cooperative group: what it owns
// and the generation it owns it in.
type coopMember struct {
	id    string
	owned map[string][]int32
	gen   int32
}

// coopRound runs one rebalance round of the cooperative balancer over
// members and returns each member's assignment and whether its assignment
// says that the next round adds to it, as the member parses them.
func coopRound(t *testing.T, members []*coopMember, counts map[string]int32) (map[string]map[string][]int32, map[string]bool) {
	t.Helper()
	bal := cooperativeBalancer()
	var jm []kmsg.JoinGroupResponseMember
	for _, m := range members {
		j := kmsg.NewJoinGroupResponseMember()
		j.MemberID = m.id
		j.ProtocolMetadata = bal.JoinGroupMetadata([]string{"decisions", "ingress"}, m.owned, m.gen)
		jm = append(jm, j)
	}
	mb, _, err := bal.MemberBalancer(jm)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := mb.(*kgo.ConsumerBalancer).BalanceOrError(counts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string][]int32{}
	pending := map[string]bool{}
	for _, a := range plan.IntoSyncAssignment() {
		var log syncLog
		parsed, err := copartitioned{log: &log, cooperative: true}.ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		if s := log.last(); !s.cooperative || !maps.EqualFunc(s.whole, parsed, slices.Equal) {
			t.Fatalf("%s: recorded %+v, parsed %v", a.MemberID, s, parsed)
		}
		got[a.MemberID], pending[a.MemberID] = parsed, log.last().pending
	}
	return got, pending
}

// coopRebalance runs rounds until one revokes nothing, as the members of a
// cooperative group do (a member that lost partitions rejoins), checking
// each round: partition p of every topic goes to one member, and a member
// gets a partition that another member owns only after that member revoked
// it. It returns how many partitions changed owner and how many rounds it
// took.
func coopRebalance(t *testing.T, members []*coopMember, counts map[string]int32) (moved, rounds int) {
	t.Helper()
	var told map[string]bool // the last round's members that were told more is to come
	for rounds = 1; rounds <= 5; rounds++ {
		got, pending := coopRound(t, members, counts)
		revoked := false
		for _, m := range members {
			mine := got[m.id]
			gained := slices.ContainsFunc(mine["ingress"], func(p int32) bool { return !slices.Contains(m.owned["ingress"], p) })
			if told != nil && told[m.id] != gained {
				t.Fatalf("round %d: %s was told more is to come: %v; it gained partitions: %v", rounds, m.id, told[m.id], gained)
			}
			for topic, ps := range mine {
				for _, p := range ps {
					if slices.Contains(m.owned[topic], p) {
						continue
					}
					for _, o := range members {
						if o != m && slices.Contains(o.owned[topic], p) {
							t.Fatalf("round %d: %s %d assigned to %s while %s still owns it", rounds, topic, p, m.id, o.id)
						}
					}
					moved++
				}
			}
			for topic, ps := range m.owned {
				for _, p := range ps {
					if !slices.Contains(mine[topic], p) {
						revoked = true
					}
				}
			}
		}
		owner := map[string]map[int32]string{}
		for id, topics := range got {
			for topic, ps := range topics {
				for _, p := range ps {
					if owner[topic] == nil {
						owner[topic] = map[int32]string{}
					}
					if o, dup := owner[topic][p]; dup {
						t.Fatalf("round %d: %s %d assigned to %s and %s", rounds, topic, p, o, id)
					}
					owner[topic][p] = id
				}
			}
		}
		for p, o := range owner["ingress"] {
			if d, ok := owner["decisions"][p]; ok && d != o {
				t.Fatalf("round %d: partition %d: ingress to %s, decisions to %s", rounds, p, o, d)
			}
		}
		for _, m := range members {
			m.owned, m.gen = got[m.id], m.gen+1
		}
		if !revoked {
			for id, more := range pending {
				if more {
					t.Fatalf("round %d revoked nothing, yet it tells %s that more is to come", rounds, id)
				}
			}
			// the last round leaves every partition assigned, in fair shares
			for topic, n := range counts {
				if int32(len(owner[topic])) != n {
					t.Fatalf("%d of %d partitions of %s assigned: %v", len(owner[topic]), n, topic, got)
				}
			}
			var sizes []int
			for _, m := range members {
				sizes = append(sizes, len(m.owned["ingress"]))
			}
			if slices.Max(sizes)-slices.Min(sizes) > 1 {
				t.Fatalf("unbalanced: %v", sizes)
			}
			return moved, rounds
		}
		told = pending
	}
	t.Fatal("the group did not settle in 5 rounds")
	return 0, 0
}

// Guards decisions through a deploy: in the cooperative protocol a member
// keeps the partitions it owns while the group rebalances, and only what
// must move to balance the group moves, in two rounds where it moves from
// one member to another (revoked first, then assigned), in one where its
// owner left. A new group gets the range assignment, partition p of both
// topics goes to one member, and a member that gets more in the next round
// is told so.
func TestCooperativeAssignmentMovesOnlyWhatMust(t *testing.T) {
	counts := map[string]int32{"ingress": 12, "decisions": 12}
	a, b, c := &coopMember{id: "a", gen: -1}, &coopMember{id: "b", gen: -1}, &coopMember{id: "c", gen: -1}
	moved, rounds := coopRebalance(t, []*coopMember{a, b, c}, counts)
	if rounds != 1 || moved != 24 {
		t.Errorf("a new group: %d rounds, %d partitions assigned; want 1 and 24", rounds, moved)
	}
	for i, m := range []*coopMember{a, b, c} {
		want := []int32{int32(4 * i), int32(4*i + 1), int32(4*i + 2), int32(4*i + 3)}
		if !slices.Equal(m.owned["ingress"], want) || !slices.Equal(m.owned["decisions"], want) {
			t.Errorf("a new group: %s owns %v, want the range assignor's %v", m.id, m.owned, want)
		}
	}

	// c leaves: a and b keep theirs and take c's in one round
	aHad, bHad := slices.Clone(a.owned["ingress"]), slices.Clone(b.owned["ingress"])
	moved, rounds = coopRebalance(t, []*coopMember{a, b}, counts)
	if rounds != 1 || moved != 8 {
		t.Errorf("c left: %d rounds, %d partitions moved; want 1 and c's 8", rounds, moved)
	}
	for _, p := range aHad {
		if !slices.Contains(a.owned["ingress"], p) {
			t.Errorf("c left: a lost %d", p)
		}
	}
	for _, p := range bHad {
		if !slices.Contains(b.owned["ingress"], p) {
			t.Errorf("c left: b lost %d", p)
		}
	}

	// c comes back with nothing: a and b each revoke two, then c gets them,
	// its own four of before: the group is back to the range layout
	c = &coopMember{id: "c", gen: -1}
	moved, rounds = coopRebalance(t, []*coopMember{a, b, c}, counts)
	if rounds != 2 || moved != 8 {
		t.Errorf("c joined: %d rounds, %d partitions moved; want 2 and 8 (4 of each topic)", rounds, moved)
	}
	for i, m := range []*coopMember{a, b, c} {
		want := []int32{int32(4 * i), int32(4*i + 1), int32(4*i + 2), int32(4*i + 3)}
		if !slices.Equal(m.owned["ingress"], want) {
			t.Errorf("c came back: %s owns %v, want %v as before c left", m.id, m.owned["ingress"], want)
		}
	}

	// a fourth member: three partitions move, one from each
	d := &coopMember{id: "d", gen: -1}
	if moved, _ = coopRebalance(t, []*coopMember{a, b, c, d}, counts); moved != 6 {
		t.Errorf("d joined: %d partitions moved, want 6 (3 of each topic)", moved)
	}
}

// Guards the cooperative protocol while the topics' counts differ (one
// topic's partitions added before the other's) and against a stale claim:
// a member that missed rebalances names partitions that another member owns
// in a later generation, and the later owner keeps them.
func TestCooperativeAssignmentCopartitionsAndDropsStaleClaims(t *testing.T) {
	counts := map[string]int32{"ingress": 6, "decisions": 4}
	a, b := &coopMember{id: "a", gen: -1}, &coopMember{id: "b", gen: -1}
	coopRebalance(t, []*coopMember{a, b}, counts)
	c := &coopMember{id: "c", gen: -1}
	coopRebalance(t, []*coopMember{a, b, c}, counts) // checks co-partitioning each round

	x := &coopMember{id: "x", gen: 3, owned: map[string][]int32{"ingress": {0, 1, 2}, "decisions": {0, 1, 2}}}
	y := &coopMember{id: "y", gen: 7, owned: map[string][]int32{"ingress": {0, 1}, "decisions": {0, 1}}}
	got, _ := coopRound(t, []*coopMember{x, y}, map[string]int32{"ingress": 4, "decisions": 4})
	if !slices.Equal(got["y"]["ingress"], []int32{0, 1}) {
		t.Errorf("y owns 0 and 1 in generation 7, x claims them from generation 3: y gets %v, want [0 1]", got["y"]["ingress"])
	}
}
