// Package docscheck reads the project's Markdown (README.md and docs/*.md)
// the way a reader follows it: every relative link must lead to a file that
// exists and, for a #fragment, to a heading of it; every faultrouter command
// shown must name a verb and flags the binary has. It finds the links and
// the commands; the flags themselves are checked against the verbs' --help
// by a test of cmd/faultrouter, which holds the flag sets.
//
// What counts as a command: in code spans and in fenced blocks of shell or
// plain text (not Python, Go, YAML or JSON), the word faultrouter (also as
// the last element of a path: bin/faultrouter, ./cmd/faultrouter) followed
// by a lower-case verb, an optional lower-case sub-verb for the verbs that
// have them, and the tokens up to the end of the line or a shell operator
// (|, <, >, ;, &&, #). A token that starts with - and a letter is a flag;
// -24h or -7d are values.
package docscheck

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// Problem is one broken link or unknown command, where a reader meets it.
type Problem struct {
	File string // as given to the check
	Line int    // 1-based
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Files returns README.md and every docs/*.md under root, in a stable order.
func Files(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(docs)
	return append([]string{filepath.Join(root, "README.md")}, docs...), nil
}

// line is one line of a Markdown file with what the checks need to know.
type line struct {
	n     int
	text  string
	code  bool   // inside a fenced block
	lang  string // the fenced block's info string, lower case
	fence bool   // the fence line itself
}

func readLines(path string) ([]line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out    []line
		inCode bool
		marker string
		lang   string
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		t := sc.Text()
		trim := strings.TrimLeft(t, " ")
		if !inCode && (strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~")) {
			inCode, marker = true, trim[:3]
			lang = strings.ToLower(strings.TrimSpace(strings.TrimLeft(trim, "`~")))
			out = append(out, line{n: n, text: t, fence: true})
			continue
		}
		if inCode && strings.HasPrefix(trim, marker) && strings.TrimLeft(trim, marker[:1]) == "" {
			inCode = false
			out = append(out, line{n: n, text: t, fence: true})
			continue
		}
		out = append(out, line{n: n, text: t, code: inCode, lang: lang})
	}
	return out, sc.Err()
}

var (
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	linkRe   = regexp.MustCompile(`!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	schemeRe = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// Links reports every relative link of the files that does not resolve: a
// path (relative to the linking file) that does not exist, or a #fragment
// that is no heading of the Markdown file it points to. Links to other
// schemes (https:, mailto:) are not followed.
func Links(files []string) ([]Problem, error) {
	var problems []Problem
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		lines, err := readLines(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(lines)
		anchors[path] = a
		return a, nil
	}
	for _, file := range files {
		lines, err := readLines(file)
		if err != nil {
			return nil, err
		}
		for _, l := range lines {
			if l.code || l.fence {
				continue
			}
			text := codeSpan.ReplaceAllString(l.text, "")
			for _, m := range linkRe.FindAllStringSubmatch(text, -1) {
				target := m[2]
				if schemeRe.MatchString(target) {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
					if _, err := os.Stat(dest); err != nil {
						problems = append(problems, Problem{file, l.n, fmt.Sprintf("link %q: %s does not exist", target, path)})
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					problems = append(problems, Problem{file, l.n, fmt.Sprintf("link %q: a #fragment needs a Markdown file", target)})
					continue
				}
				a, err := anchorsOf(dest)
				if err != nil {
					return nil, err
				}
				if !a[frag] {
					problems = append(problems, Problem{file, l.n, fmt.Sprintf("link %q: %s has no heading #%s", target, filepath.Base(dest), frag)})
				}
			}
		}
	}
	return problems, nil
}

// headingAnchors returns the anchors GitHub gives the headings of a file:
// the heading's text, lower case, without punctuation, spaces as hyphens, a
// repeated one suffixed -1, -2 and so on.
func headingAnchors(lines []line) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range lines {
		if l.code || l.fence || !strings.HasPrefix(l.text, "#") {
			continue
		}
		text := strings.TrimLeft(l.text, "#")
		if text == "" || text[0] != ' ' {
			continue
		}
		slug := Slug(text)
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Slug is GitHub's anchor of a heading's text.
func Slug(heading string) string {
	heading = linkRe.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Command is one faultrouter command shown in the docs.
type Command struct {
	File  string
	Line  int
	Verb  []string // the verb, and its sub-verb if it has one: ["policy", "whatif"]
	Flags []string // without dashes or values: "since", "format"
	Text  string   // as shown
}

// SubVerbs are the verbs whose first argument is a sub-verb.
var SubVerbs = map[string]bool{"review": true, "breaker": true, "policy": true, "topics": true, "schemas": true}

// shellBlock reports whether a fenced block's info string is shell or text.
func shellBlock(lang string) bool {
	switch lang {
	case "", "sh", "shell", "bash", "console", "text", "txt":
		return true
	}
	return false
}

var (
	cmdRe   = regexp.MustCompile(`(?:^|[\s(\x60/$])faultrouter[ \t]+([a-z][a-z-]*)`)
	flagRe  = regexp.MustCompile(`^--?([a-zA-Z][a-zA-Z0-9-]*)`)
	stopTok = map[string]bool{"|": true, "||": true, "<": true, ">": true, ">>": true, ";": true, "&&": true, "&": true, "#": true, "2>&1": true}
)

// Commands returns every faultrouter command the files show.
func Commands(files []string) ([]Command, error) {
	var out []Command
	for _, file := range files {
		lines, err := readLines(file)
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(lines); i++ {
			l := lines[i]
			if l.fence {
				continue
			}
			if l.code {
				if !shellBlock(l.lang) {
					continue
				}
				text := l.text
				for strings.HasSuffix(strings.TrimSpace(text), "\\") && i+1 < len(lines) && lines[i+1].code {
					text = strings.TrimSuffix(strings.TrimSpace(text), "\\") + " " + lines[i+1].text
					i++
				}
				out = append(out, commandsIn(file, l.n, text)...)
				continue
			}
			for _, span := range codeSpan.FindAllString(l.text, -1) {
				out = append(out, commandsIn(file, l.n, strings.Trim(span, "`"))...)
			}
		}
	}
	return out, nil
}

// commandsIn finds the commands of one line (or one code span).
func commandsIn(file string, n int, text string) []Command {
	var out []Command
	for _, loc := range cmdRe.FindAllStringSubmatchIndex(text, -1) {
		start := loc[2]
		rest := strings.Fields(text[start:])
		c := Command{File: file, Line: n, Verb: []string{rest[0]}}
		rest = rest[1:]
		if SubVerbs[c.Verb[0]] && len(rest) > 0 && isWord(rest[0]) {
			c.Verb = append(c.Verb, rest[0])
			rest = rest[1:]
		}
		shown := []string{"faultrouter", strings.Join(c.Verb, " ")}
		for _, tok := range rest {
			if stopTok[tok] || strings.HasPrefix(tok, "#") || strings.HasPrefix(tok, ">") || strings.HasPrefix(tok, "<") {
				break
			}
			shown = append(shown, tok)
			if m := flagRe.FindStringSubmatch(tok); m != nil {
				c.Flags = append(c.Flags, m[1])
			}
			if strings.HasSuffix(tok, ")") {
				break // the end of a parenthesis the command was shown in
			}
		}
		c.Text = strings.Join(shown, " ")
		out = append(out, c)
	}
	return out
}

func isWord(s string) bool {
	for _, r := range s {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return s != ""
}
