package taskid

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

var idPattern = regexp.MustCompile(`^t1-[a-z2-7]{26}$`)

// Guards "same input, same ID": repeated calls, FromContent and FromReader,
// and a reader that returns one byte at a time all give the byte-identical
// ID, in the documented format.
func TestDeterministic(t *testing.T) {
	content := bytes.Repeat([]byte("invoice line\n"), 10000)
	want := FromContent(content, "u-17", "refund", "")
	if !idPattern.MatchString(want) || len(want) != Len {
		t.Fatalf("ID %q does not match %s (len %d)", want, idPattern, Len)
	}
	for i := 0; i < 3; i++ {
		if got := FromContent(bytes.Clone(content), "u-17", "refund", ""); got != want {
			t.Errorf("call %d: %q, want %q", i, got, want)
		}
	}
	for name, r := range map[string]io.Reader{
		"whole":      bytes.NewReader(content),
		"byte-wise":  iotest.OneByteReader(bytes.NewReader(content)),
		"half-reads": iotest.HalfReader(bytes.NewReader(content)),
	} {
		got, err := FromReader(r, "u-17", "refund", "")
		if err != nil || got != want {
			t.Errorf("FromReader %s = %q, %v; want %q", name, got, err, want)
		}
	}
}

// Guards "one changed byte of content gives a different ID": flipping any
// single byte, appending one, or dropping the last one changes the ID.
func TestOneByteChange(t *testing.T) {
	content := []byte("contract v3: the buyer pays 30.00 EUR within 14 days")
	base := FromContent(content, "alice", "contract_review", "")
	for i := range content {
		c := bytes.Clone(content)
		c[i] ^= 0x01
		if got := FromContent(c, "alice", "contract_review", ""); got == base {
			t.Errorf("flipping byte %d left the ID at %q", i, got)
		}
	}
	if FromContent(append(bytes.Clone(content), ' '), "alice", "contract_review", "") == base {
		t.Error("appending a byte left the ID unchanged")
	}
	if FromContent(content[:len(content)-1], "alice", "contract_review", "") == base {
		t.Error("dropping the last byte left the ID unchanged")
	}
}

// Guards that every input is part of the identity: a different user, action
// or authorization gives a different ID, and --authorization separates two
// separately approved, otherwise identical operations.
func TestEveryFieldCounts(t *testing.T) {
	content := []byte("refund order 1042: 30.00 EUR")
	ids := map[string]string{}
	for name, id := range map[string]string{
		"base":             FromContent(content, "bob", "refund", ""),
		"other user":       FromContent(content, "bobby", "refund", ""),
		"other action":     FromContent(content, "bob", "refund_partial", ""),
		"approval 7":       FromContent(content, "bob", "refund", "approval-7"),
		"approval 8":       FromContent(content, "bob", "refund", "approval-8"),
		"empty content":    FromContent(nil, "bob", "refund", ""),
		"all fields empty": FromContent(nil, "", "", ""),
	} {
		if prev, ok := ids[id]; ok {
			t.Errorf("%s and %s share the ID %s", name, prev, id)
		}
		ids[id] = name
	}
}

// Guards the length-prefixed encoding: moving bytes across a field boundary
// ("ab"+"c" versus "a"+"bc") never yields the same ID.
func TestFieldBoundaries(t *testing.T) {
	c := []byte("same content")
	pairs := []struct{ name, a, b string }{
		{"user/action", FromContent(c, "ab", "c", ""), FromContent(c, "a", "bc", "")},
		{"action/authorization", FromContent(c, "u", "ab", "c"), FromContent(c, "u", "a", "bc")},
		{"user/authorization via empty action", FromContent(c, "ab", "", ""), FromContent(c, "a", "", "b")},
		{"separator inside a field", FromContent(c, "a:b", "c", ""), FromContent(c, "a", "b:c", "")},
	}
	for _, p := range pairs {
		if p.a == p.b {
			t.Errorf("%s: both give %s", p.name, p.a)
		}
	}
}

// Guards FromReader's error contract: a read error is returned, not hashed
// into an ID.
func TestFromReaderError(t *testing.T) {
	boom := errors.New("disk gone")
	id, err := FromReader(io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(boom)), "u", "a", "")
	if !errors.Is(err, boom) || id != "" {
		t.Errorf("FromReader = %q, %v; want \"\", %v", id, err, boom)
	}
}
