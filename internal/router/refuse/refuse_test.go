package refuse

import (
	"errors"
	"testing"
)

// Guards the bound of the refused-input map: an input whose routed record
// the broker refused is remembered until its batch commits, and one of a
// partition that has moved to another instance (which this instance never
// polls again) is let go the next time inputs are remembered.
func TestRefusedInputsOfMovedPartitionsAreLetGo(t *testing.T) {
	u := &Refusals{owned: func() map[int32]bool { return map[int32]bool{0: true} }, byInput: map[inputAt]refused{
		{topic: "ingress", partition: 0, offset: 7}: {kind: KindTooLarge, err: errors.New("too large")},
		{topic: "ingress", partition: 3, offset: 9}: {kind: KindTooLarge, err: errors.New("too large")},
	}}
	u.Remember(nil, nil)
	if _, ok := u.byInput[inputAt{topic: "ingress", partition: 0, offset: 7}]; !ok || len(u.byInput) != 1 {
		t.Errorf("refused inputs %v, want only the one of owned partition 0", u.byInput)
	}
}
