package main

import (
	"strings"
	"testing"
)

// Guards the operator named on re-driven records: with no --operator and
// neither $USER nor an OS account name, `replay --redrive-to` is refused
// with a message naming --operator, before anything is read or sent; a
// name given is kept.
func TestRedriveNeedsAnOperator(t *testing.T) {
	f := replayFlags{topic: "deadletter", redriveTo: "ingress", maxRedrives: 3, operator: " "}
	if err := f.validate(); err == nil || !strings.Contains(err.Error(), "--redrive-to needs --operator NAME") {
		t.Errorf("no operator: %v, want a refusal naming --operator", err)
	}
	f.operator = "carol"
	if err := f.validate(); err != nil {
		t.Errorf("operator carol: %v", err)
	}
	f = replayFlags{topic: "deadletter", maxRedrives: 3}
	if err := f.validate(); err != nil {
		t.Errorf("no re-drive, no operator: %v (the operator matters only to a re-drive)", err)
	}
}
