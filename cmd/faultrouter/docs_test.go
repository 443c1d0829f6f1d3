package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/internal/docscheck"
)

// TestDocsCommandsKnownToHelp guards the commands README.md and docs/*.md
// show: each names a verb of `faultrouter help` and only flags that verb's
// --help lists.
func TestDocsCommandsKnownToHelp(t *testing.T) {
	files, err := docscheck.Files(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := docscheck.Commands(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 50 {
		t.Fatalf("only %d commands found in the docs: is the extraction broken?", len(cmds))
	}
	for _, p := range checkCommands(cmds) {
		t.Error(p)
	}
	t.Logf("%d commands checked", len(cmds))
}

// TestDocsCommandsFixture guards the check itself: an unknown flag and an
// unknown verb are reported, known ones are not.
func TestDocsCommandsFixture(t *testing.T) {
	cmds, err := docscheck.Commands([]string{filepath.Join("testdata", "docs-commands.md")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range checkCommands(cmds) {
		got = append(got, p.Msg)
	}
	want := []string{
		`faultrouter produce --no-such-flag: produce has no flag --no-such-flag (faultrouter produce --help)`,
		`faultrouter replay --task t-1 --timelines: replay has no flag --timelines (faultrouter replay --help)`,
		`faultrouter frobnicate --now: no verb frobnicate (faultrouter help)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var (
	verbLine = regexp.MustCompile(`(?m)^  ([a-z]+)  `)
	flagLine = regexp.MustCompile(`(?m)^  -([a-zA-Z0-9-]+)`)
)

// checkCommands checks each command against the verbs of the usage text and
// the flags its verb's --help prints.
func checkCommands(cmds []docscheck.Command) []docscheck.Problem {
	verbs := map[string]bool{"help": true}
	for _, m := range verbLine.FindAllStringSubmatch(usage, -1) {
		verbs[m[1]] = true
	}
	helps := map[string]map[string]bool{}
	var problems []docscheck.Problem
	for _, c := range cmds {
		if !verbs[c.Verb[0]] {
			problems = append(problems, docscheck.Problem{File: c.File, Line: c.Line, Msg: fmt.Sprintf("%s: no verb %s (faultrouter help)", c.Text, c.Verb[0])})
			continue
		}
		if len(c.Flags) == 0 {
			continue
		}
		verb := strings.Join(c.Verb, " ")
		flags, ok := helps[verb]
		if !ok {
			var err error
			if flags, err = helpFlags(c.Verb); err != nil {
				problems = append(problems, docscheck.Problem{File: c.File, Line: c.Line, Msg: fmt.Sprintf("%s: %v", c.Text, err)})
				continue
			}
			helps[verb] = flags
		}
		for _, f := range c.Flags {
			if !flags[f] {
				problems = append(problems, docscheck.Problem{File: c.File, Line: c.Line, Msg: fmt.Sprintf("%s: %s has no flag --%s (faultrouter %s --help)", c.Text, verb, f, verb)})
			}
		}
	}
	return problems
}

// helpFlags runs `faultrouter VERB [SUB] --help` in this process and returns
// the flags it lists.
func helpFlags(verb []string) (map[string]bool, error) {
	var out bytes.Buffer
	err := dispatch(context.Background(), append(append([]string{}, verb...), "--help"), strings.NewReader(""), &out, &out)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return nil, fmt.Errorf("faultrouter %s --help: %v", strings.Join(verb, " "), err)
	}
	flags := map[string]bool{"help": true, "h": true}
	for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	return flags, nil
}
