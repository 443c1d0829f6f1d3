package router

// balancer.go assigns the partitions of ingress and decisions to the group's
// members co-partitioned whatever their partition counts: partition p of
// every topic goes to the same member. Kafka's range assignor splits each
// topic on its own, so while the topics' counts differ (adding partitions
// is not atomic: one topic at a time) it can give ingress partition 1 to one
// instance and decisions partition 1 to another; both would then route the
// tasks of partition 1, each against its own store, and write the state
// changelog of a partition the other owns. Here the partition numbers
// 0..max-1 (max: the largest count among the topics) are split in ranges
// over the members sorted by ID, as the range assignor does with equal
// counts, and a member gets partition p of each topic that has it. With equal
// counts the assignment is the range assignor's.
//
// The protocol is offered before "range", so that a group mid-upgrade whose
// older members know only "range" keeps working: the group uses this one
// once every member offers it.

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// copartitionedProtocol is the name of the group protocol.
const copartitionedProtocol = "faultrouter-copartitioned"

type copartitioned struct{}

// copartitionedBalancer returns the co-partitioned group balancer.
func copartitionedBalancer() kgo.GroupBalancer { return copartitioned{} }

func (copartitioned) ProtocolName() string { return copartitionedProtocol }
func (copartitioned) IsCooperative() bool  { return false }

func (copartitioned) JoinGroupMetadata(interests []string, _ map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	return meta.AppendTo(nil)
}

func (copartitioned) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

func (c copartitioned) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	b, err := kgo.NewConsumerBalancer(c, members)
	if err != nil {
		return nil, nil, err
	}
	return b, b.MemberTopics(), nil
}

// Balance splits the partition numbers in ranges over the members (sorted
// by instance ID, else member ID) and gives each member partition p of every
// topic it consumes that has a partition p.
func (copartitioned) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	type member struct {
		m      *kmsg.JoinGroupResponseMember
		topics []string
	}
	var ms []member
	b.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		ms = append(ms, member{m, meta.Topics})
	})
	sort.Slice(ms, func(i, j int) bool { return memberLess(ms[i].m, ms[j].m) })
	plan := b.NewPlan()
	if len(ms) == 0 {
		return plan
	}
	var most int32
	for _, n := range topics {
		most = max(most, n)
	}
	div, rem := int(most)/len(ms), int(most)%len(ms)
	p := int32(0)
	for i, m := range ms {
		n := div
		if i < rem {
			n++
		}
		for range n {
			for _, t := range m.topics {
				if count, ok := topics[t]; ok && p < count {
					plan.AddPartition(m.m, t, p)
				}
			}
			p++
		}
	}
	return plan
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
