package policy

import (
	"testing"
	"unicode"
)

// TestRefusalLibrary guards the refusal phrases: the built-in library holds at
// least 27 variants in Chinese and English, including the ones the issue
// names, and every phrase matches itself once normalised.
func TestRefusalLibrary(t *testing.T) {
	lib := DefaultRefusalPhrases()
	if len(lib) < 27 {
		t.Fatalf("%d refusal phrases, want at least 27", len(lib))
	}
	var zh, en int
	for _, p := range lib {
		if latinOnly(p) || !hasHan(p) {
			en++
		} else {
			zh++
		}
	}
	if zh < 10 || en < 10 {
		t.Errorf("%d Chinese and %d English phrases, want both languages well covered", zh, en)
	}
	set := compilePhrases(lib)
	for _, p := range lib {
		if _, ok := set.match(p); !ok {
			t.Errorf("phrase %q does not match itself", p)
		}
	}
	for _, p := range []string{"无法回答", "需要更多信息", "我不能处理", "I cannot help with that", "I'm unable to", "as an AI"} {
		if _, ok := set.match(p); !ok {
			t.Errorf("the library misses %q", p)
		}
	}
}

// TestRefusalMatching guards the matching rules: case, full-width forms,
// punctuation and spacing are ignored; English phrases match whole words.
func TestRefusalMatching(t *testing.T) {
	set := compilePhrases(DefaultRefusalPhrases())
	cases := []struct {
		text string
		want bool
	}{
		{"我无法回答这个问题", true},
		{"无法，回答！", true},
		{"无 法 回 答", true},
		{"需要更多信息。", true},
		{"ＩＣＡＮＮＯＴ ＨＥＬＰ ＷＩＴＨ ＴＨＡＴ", false}, // words run together: no word boundary
		{"Ｉ　ＣＡＮＮＯＴ　ＨＥＬＰ　ＷＩＴＨ　ＴＨＡＴ", true},
		{"i CANNOT help, with... that!", true},
		{"I’m unable to do this", true},
		{"Im unable to", true},
		{"AS AN AI, I think", true},
		{"作为一个ＡＩ，我不能", true},
		{"The supplier has an aim", false},
		{"A pleasant basin", false},
		{"Clause 7 is valid.", false},
		{"", false},
	}
	for _, c := range cases {
		if _, got := set.match(c.text); got != c.want {
			t.Errorf("match(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func hasHan(s string) bool {
	for _, r := range s {
		if unicode.Is(unicode.Han, r) {
			return true
		}
	}
	return false
}
