package router

// balancer.go assigns the partitions of ingress and decisions to the group's
// members co-partitioned whatever their partition counts: partition p of
// every topic goes to the same member. Kafka's range assignor splits each
// topic on its own, so while the topics' counts differ (adding partitions
// is not atomic: one topic at a time) it can give ingress partition 1 to one
// instance and decisions partition 1 to another; both would then route the
// tasks of partition 1, each against its own store, and write the state
// changelog of a partition the other owns. Here the partition numbers
// 0..max-1 (max: the largest count among the topics) are what is assigned,
// and a member gets partition p of each topic that has it.
//
// Two protocols, offered in this order (the cooperative one unless
// Config.GroupProtocol is "eager"), then Kafka's "range":
//
//   - "faultrouter-copartitioned-cooperative" (cooperative, KIP-429): a
//     member keeps the partition numbers it owns up to its fair share, and
//     only what must move to balance the group moves. A rebalance does not
//     stop the members: each keeps routing what it keeps while the group
//     rebalances. A number that moves from one member to another is
//     revoked by its owner in a first round and assigned in a second (the
//     owner revokes it, then rejoins), so no two members ever own it at
//     once. A member that leaves hands its numbers to the others in one
//     round. The assignment of a member that gets more in the second round
//     says so (its user data), and the member is not ready until then.
//   - "faultrouter-copartitioned" (eager): the numbers are
//     split in ranges over the members sorted by ID, as the range assignor
//     does with equal counts, and every rebalance revokes everything first.
//     It is what releases before the cooperative one offer first.
//
// Kafka picks the first protocol every member offers, so a group
// mid-upgrade, or rolled back, whose older members know only the eager one
// (or only "range") keeps working on that one: franz-go revokes everything
// when the group falls back from cooperative to eager. Once every member
// offers the cooperative protocol the group uses it.
//
// Each balancer records the whole assignment of the last sync (syncLog):
// franz-go passes a cooperative member's assignment callback only what was
// added, and the router needs the whole to let go of a partition whose
// revoke it was not told of (assignment.go).

import (
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The group protocols of the co-partitioned balancers.
const (
	copartitionedProtocol = "faultrouter-copartitioned"
	cooperativeProtocol   = "faultrouter-copartitioned-cooperative"
)

// morePending is the user data of a cooperative assignment that the
// member's next round adds to: partitions moving to it from another member.
var morePending = []byte{1}

// syncLog is the member's assignment of the last sync, as the balancer of
// the group's protocol parsed it.
type syncLog struct {
	mu sync.Mutex
	s  syncAssignment
}

// syncAssignment is one sync's assignment of this member.
type syncAssignment struct {
	cooperative bool               // the group's protocol is cooperative
	whole       map[string][]int32 // the member's whole assignment
	pending     bool               // the next round adds to it (cooperative only)
}

func (l *syncLog) record(s syncAssignment) {
	l.mu.Lock()
	l.s = s
	l.mu.Unlock()
}

// last returns the last sync's assignment.
func (l *syncLog) last() syncAssignment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}

// balancers returns the group balancers the router offers, in order, each
// recording its syncs in log: the cooperative one first if cooperative
// (Config.GroupProtocol), then the eager one and range.
func balancers(log *syncLog, cooperative bool) []kgo.GroupBalancer {
	bs := []kgo.GroupBalancer{copartitioned{log: log}, recordedRange{kgo.RangeBalancer(), log}}
	if cooperative {
		bs = append([]kgo.GroupBalancer{copartitioned{log: log, cooperative: true}}, bs...)
	}
	return bs
}

// copartitioned is the co-partitioned balancer, eager or cooperative.
type copartitioned struct {
	log         *syncLog // nil: not recorded
	cooperative bool
}

// copartitionedBalancer returns the eager co-partitioned group balancer.
func copartitionedBalancer() kgo.GroupBalancer { return copartitioned{} }

// cooperativeBalancer returns the cooperative co-partitioned group balancer.
func cooperativeBalancer() kgo.GroupBalancer { return copartitioned{cooperative: true} }

func (c copartitioned) ProtocolName() string {
	if c.cooperative {
		return cooperativeProtocol
	}
	return copartitionedProtocol
}

func (c copartitioned) IsCooperative() bool { return c.cooperative }

// JoinGroupMetadata is the consumer protocol's metadata. A cooperative
// member names the partitions it owns (currentAssignment): the leader keeps
// them where they are and revokes what moves before it assigns it again.
func (c copartitioned) JoinGroupMetadata(interests []string, currentAssignment map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	if c.cooperative {
		for _, topic := range slices.Sorted(maps.Keys(currentAssignment)) {
			owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
			owned.Topic = topic
			owned.Partitions = currentAssignment[topic]
			meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
		}
	}
	return meta.AppendTo(nil)
}

func (c copartitioned) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(assignment); err != nil {
		return nil, err
	}
	m := make(map[string][]int32, len(a.Topics))
	for _, t := range a.Topics {
		m[t.Topic] = t.Partitions
	}
	if c.log != nil {
		c.log.record(syncAssignment{cooperative: c.cooperative, whole: m, pending: c.cooperative && slices.Equal(a.UserData, morePending)})
	}
	return m, nil
}

func (c copartitioned) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	b, err := kgo.NewConsumerBalancer(c, members)
	if err != nil {
		return nil, nil, err
	}
	return b, b.MemberTopics(), nil
}

// member is a group member as the balancers see it.
type member struct {
	m    *kmsg.JoinGroupResponseMember
	meta *kmsg.ConsumerMemberMetadata
}

// sortedMembers returns the members sorted by instance ID, else member ID.
func sortedMembers(b *kgo.ConsumerBalancer) []member {
	var ms []member
	b.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		ms = append(ms, member{m, meta})
	})
	sort.Slice(ms, func(i, j int) bool { return memberLess(ms[i].m, ms[j].m) })
	return ms
}

// Balance assigns the partition numbers: in ranges (eager), or sticky and
// in two rounds where a number moves (cooperative).
func (c copartitioned) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	ms := sortedMembers(b)
	plan := b.NewPlan()
	if len(ms) == 0 {
		return plan
	}
	var most int32
	for _, n := range topics {
		most = max(most, n)
	}
	var owner []int // partition number -> index in ms
	if c.cooperative {
		owner = stickyNumbers(ms, topics, int(most))
	} else {
		owner = rangeNumbers(len(ms), int(most))
	}
	for p, i := range owner {
		for _, t := range ms[i].meta.Topics {
			if count, ok := topics[t]; ok && int32(p) < count {
				plan.AddPartition(ms[i].m, t, int32(p))
			}
		}
	}
	if !c.cooperative {
		return plan
	}
	planned := map[string]int{}
	for id, ts := range plan.AsMemberIDMap() {
		for _, ps := range ts {
			planned[id] += len(ps)
		}
	}
	plan.AdjustCooperative(b) // what moves is left out of this round: its owner revokes it first
	pending := map[string]bool{}
	for id, ts := range plan.AsMemberIDMap() {
		n := 0
		for _, ps := range ts {
			n += len(ps)
		}
		pending[id] = n < planned[id]
	}
	return cooperativePlan{plan, pending}
}

// rangeNumbers splits the partition numbers 0..most-1 in ranges over n
// members, as the range assignor does: member i gets the i-th range, the
// first most%n ranges one number longer.
func rangeNumbers(n, most int) []int {
	owner := make([]int, 0, most)
	div, rem := most/n, most%n
	for i := range n {
		k := div
		if i < rem {
			k++
		}
		for range k {
			owner = append(owner, i)
		}
	}
	return owner
}

// stickyNumbers assigns the partition numbers 0..most-1 over the members
// (sorted), keeping each number with the member that owns it where the
// balance allows. A member owns a number if it names partition p of any
// topic among its owned partitions; of two members that name it, the one
// of the later generation owns it, and at the same generation neither
// does. Every member's share is most/n numbers, and most%n of them one
// more: first those that own more than most/n, then in member order.
//
// A number's home is the member rangeNumbers gives it. A member keeps the
// numbers it owns up to its share, those at home first, then the lowest;
// a number left goes home if its home is below its share, else to the
// first member below its share. With nothing owned (a new group) that is
// rangeNumbers' assignment, and a member that leaves and comes back (a
// rolling restart) gets its home numbers back: the group returns to the
// same layout.
func stickyNumbers(ms []member, topics map[string]int32, most int) []int {
	owner := make([]int, most)
	gen := make([]int32, most)
	claimed := make([]bool, most)
	for p := range owner {
		owner[p] = -1
	}
	for i, m := range ms {
		g := m.meta.Generation
		for _, t := range m.meta.OwnedPartitions {
			if _, ok := topics[t.Topic]; !ok {
				continue
			}
			for _, p := range t.Partitions {
				switch {
				case p < 0 || int(p) >= most || owner[p] == i:
				case !claimed[p] || g > gen[p]:
					owner[p], gen[p], claimed[p] = i, g, true
				case g == gen[p]:
					owner[p] = -1 // two owners at one generation: neither keeps it
				}
			}
		}
	}
	n := len(ms)
	home := rangeNumbers(n, most)
	owns := make([][]int, n)
	for p, i := range owner {
		if i >= 0 {
			owns[i] = append(owns[i], p)
		}
	}
	div, extra := most/n, most%n
	share := make([]int, n)
	for i := range share {
		share[i] = div
		if extra > 0 && len(owns[i]) > div {
			share[i]++
			extra--
		}
	}
	for i := range share {
		if extra > 0 && share[i] == div {
			share[i]++
			extra--
		}
	}
	assigned := make([]int, most)
	count := make([]int, n)
	for p := range assigned {
		assigned[p] = -1
	}
	for i, ps := range owns {
		// at home first, then the lowest
		slices.SortStableFunc(ps, func(x, y int) int {
			return cmpBool(home[x] != i, home[y] != i)
		})
		for _, p := range ps[:min(len(ps), share[i])] {
			assigned[p] = i
			count[i]++
		}
	}
	for p := range assigned {
		if i := home[p]; assigned[p] < 0 && count[i] < share[i] {
			assigned[p] = i
			count[i]++
		}
	}
	i := 0
	for p := range assigned {
		if assigned[p] >= 0 {
			continue
		}
		for count[i] >= share[i] {
			i++
		}
		assigned[p] = i
		count[i]++
	}
	return assigned
}

// cmpBool orders false before true.
func cmpBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case !x:
		return -1
	}
	return 1
}

// cooperativePlan is a cooperative round's plan: the members that get more
// in the next round carry morePending as their assignment's user data.
type cooperativePlan struct {
	plan    *kgo.BalancePlan
	pending map[string]bool
}

func (c cooperativePlan) IntoSyncAssignment() []kmsg.SyncGroupRequestGroupAssignment {
	out := c.plan.IntoSyncAssignment()
	for i := range out {
		if !c.pending[out[i].MemberID] {
			continue
		}
		var a kmsg.ConsumerMemberAssignment
		if err := a.ReadFrom(out[i].MemberAssignment); err != nil {
			continue // it was just encoded; cannot happen
		}
		a.UserData = morePending
		out[i].MemberAssignment = a.AppendTo(nil)
	}
	return out
}

// memberLess orders members as Kafka's range assignor does: by static
// instance ID when they have one, else by member ID.
func memberLess(l, r *kmsg.JoinGroupResponseMember) bool {
	switch {
	case l.InstanceID != nil && r.InstanceID != nil:
		return *l.InstanceID < *r.InstanceID
	case l.InstanceID != nil:
		return true
	case r.InstanceID != nil:
		return false
	}
	return l.MemberID < r.MemberID
}

// recordedRange is Kafka's range balancer, its syncs recorded as eager.
type recordedRange struct {
	kgo.GroupBalancer
	log *syncLog
}

func (r recordedRange) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	m, err := r.GroupBalancer.ParseSyncAssignment(assignment)
	if err == nil {
		r.log.record(syncAssignment{whole: m})
	}
	return m, err
}
