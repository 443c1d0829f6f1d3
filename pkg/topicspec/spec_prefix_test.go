package topicspec

import "testing"

// Guards the prefix a Set keeps for the topics of other tools beside the
// router's (the console's own topic): Load's, through the overrides.
func TestSetKeepsItsPrefix(t *testing.T) {
	s, err := Load("team-a.")
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []Set{s, s.WithPartitions(3), s.WithReplicationFactor(3)} {
		if got := set.Prefix(); got != "team-a." {
			t.Errorf("Prefix() = %q, want team-a.", got)
		}
	}
	if name, _ := s.Name("state"); name != s.Prefix()+"faultrouter.state" {
		t.Errorf("the state topic %q does not begin with the prefix", name)
	}
}

// Guards the one declaration of the topics' names: Topics gives every short
// name's full name, prefix included.
func TestTopicsNamesEveryTopic(t *testing.T) {
	s, err := Load("p.")
	if err != nil {
		t.Fatal(err)
	}
	got := s.Topics()
	for short, name := range map[Short]string{"ingress": got.Ingress, "decisions": got.Decisions, "retry": got.Retry, "review": got.Review,
		"audit": got.Audit, "deadletter": got.DeadLetter, "alerts": got.Alerts, "state": got.State, "breakers": got.Breakers} {
		if want, _ := s.Name(short); name != want {
			t.Errorf("Topics() names %s %q, want %q", short, name, want)
		}
	}
}
