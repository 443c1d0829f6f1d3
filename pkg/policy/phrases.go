package policy

import (
	"strings"
	"unicode"
)

// defaultRefusalPhrases is the built-in refusal-phrase library: what models
// say instead of an answer, in Chinese and English. Matching ignores case,
// full-width forms, punctuation and spacing (see normalise).
var defaultRefusalPhrases = []string{
	// Chinese.
	"无法回答",
	"无法确定",
	"需要更多信息",
	"请提供更多信息",
	"请提供更多细节",
	"我不能处理",
	"我无法处理",
	"无法处理您的请求",
	"我不能回答",
	"我无法提供",
	"我无法完成",
	"我无法协助",
	"我不能帮助",
	"我没有足够的信息",
	"超出了我的能力范围",
	"作为一个AI",
	"作为一个人工智能",
	"作为AI语言模型",
	"抱歉我无法",
	// English.
	"I cannot help with that",
	"I can't help with that",
	"I'm unable to",
	"I am unable to",
	"I'm not able to",
	"I am not able to",
	"I cannot assist",
	"I can't assist",
	"I cannot comply",
	"I won't be able to",
	"I'm sorry, but I cannot",
	"as an AI",
	"as an AI language model",
	"I don't have enough information",
	"I need more information",
	"please provide more details",
}

// DefaultRefusalPhrases returns a copy of the built-in refusal-phrase library.
func DefaultRefusalPhrases() []string {
	return append([]string(nil), defaultRefusalPhrases...)
}

// phraseSet is a compiled refusal-phrase library. A phrase written only in
// Latin letters and digits matches whole words ("as an AI" does not match
// "has an aim"); any other phrase (Chinese) matches anywhere once punctuation
// and spacing are removed ("无法，回答" matches 无法回答).
type phraseSet struct {
	words   []phrase // matched against " word word " with spaces on both ends
	compact []phrase // matched against the text with every separator removed
}

type phrase struct {
	source string // as written in the policy
	norm   string
}

func compilePhrases(list []string) *phraseSet {
	s := new(phraseSet)
	for _, src := range list {
		spaced, compact := normalise(src)
		if compact == "" {
			continue // Validate rejects these; never match everything
		}
		if latinOnly(compact) {
			s.words = append(s.words, phrase{src, " " + spaced + " "})
		} else {
			s.compact = append(s.compact, phrase{src, compact})
		}
	}
	return s
}

// match returns the first phrase of the set found in text.
func (s *phraseSet) match(text string) (string, bool) {
	if text == "" {
		return "", false
	}
	spaced, compact := normalise(text)
	spaced = " " + spaced + " "
	for _, p := range s.compact {
		if strings.Contains(compact, p.norm) {
			return p.source, true
		}
	}
	for _, p := range s.words {
		if strings.Contains(spaced, p.norm) {
			return p.source, true
		}
	}
	return "", false
}

// normalise folds s for phrase matching: full-width forms to their ASCII
// equivalents (an NFKC subset done by hand), lower case, apostrophes removed
// (I'm = Im), every other run of punctuation, symbols and spacing to one
// space. It returns that spaced form and the compact form without spaces.
func normalise(s string) (spaced, compact string) {
	var sp, co strings.Builder
	sp.Grow(len(s))
	co.Grow(len(s))
	gap := false
	for _, r := range s {
		r = foldWidth(r)
		switch {
		case isApostrophe(r):
			continue
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			r = unicode.ToLower(r)
			if gap && sp.Len() > 0 {
				sp.WriteByte(' ')
			}
			gap = false
			sp.WriteRune(r)
			co.WriteRune(r)
		case unicode.IsMark(r):
			// Combining marks belong to the letter before them.
			sp.WriteRune(r)
			co.WriteRune(r)
		default:
			gap = true
		}
	}
	return sp.String(), co.String()
}

// foldWidth maps the full-width forms U+FF01..U+FF5E to ASCII and the
// ideographic space to a space.
func foldWidth(r rune) rune {
	switch {
	case r >= 0xFF01 && r <= 0xFF5E:
		return r - 0xFEE0
	case r == 0x3000:
		return ' '
	}
	return r
}

func isApostrophe(r rune) bool {
	switch r {
	case '\'', '\u2018', '\u2019', '\u02BC', '`':
		return true
	}
	return false
}

func latinOnly(s string) bool {
	for _, r := range s {
		if !unicode.IsDigit(r) && !unicode.Is(unicode.Latin, r) && !unicode.IsMark(r) {
			return false
		}
	}
	return true
}
