package emit

import (
	"bytes"
	"testing"
)

// Guards the batch arena: values handed out never overlap (an append past a
// value's room moves it out instead of writing into the next one), records
// are distinct and zero, and a batch of about the size of the one before
// allocates nothing once the arena has grown to it.
func TestArenaValuesStayApart(t *testing.T) {
	var a Arena
	fill := func() [][]byte {
		var vals [][]byte
		for i := range 3000 {
			n := 10 + i%700
			v := a.Bytes(n)
			vals = append(vals, append(v, bytes.Repeat([]byte{byte(i)}, n)...))
			if r := a.Record(); r.Value != nil || r.Topic != "" {
				t.Fatalf("record %d is not zero: %+v", i, r)
			}
		}
		for i := 0; i < len(vals); i += 7 { // past their room: must not touch a neighbour
			vals[i] = append(vals[i], 0xFF)
		}
		return vals
	}
	check := func(vals [][]byte) {
		for i, v := range vals {
			n := 10 + i%700
			if !bytes.Equal(v[:n], bytes.Repeat([]byte{byte(i)}, n)) {
				t.Fatalf("value %d was overwritten", i)
			}
		}
	}
	check(fill())
	a.Reset()
	check(fill())
	a.Reset()
	size := 3000
	if n := testing.AllocsPerRun(3, func() {
		size += 30 // batches grow a little
		for i := range size {
			a.Bytes(10 + i%700)
			a.Record().Topic = "t"
		}
		a.Reset()
	}); n != 0 {
		t.Errorf("a batch the arena has room for allocated %v times", n)
	}
}
