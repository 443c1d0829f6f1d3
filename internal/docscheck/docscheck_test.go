package docscheck

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestDocsLinksResolve guards the docs a reader follows: every relative link
// of README.md and docs/*.md leads to a file that exists and, for a
// #fragment, to one of its headings.
func TestDocsLinksResolve(t *testing.T) {
	files, err := Files(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	problems, err := Links(files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestLinksFixture guards the check itself: a link to a file that does not
// exist and one to a heading that does not exist are reported, with their
// lines; good links, code and other schemes are not.
func TestLinksFixture(t *testing.T) {
	problems, err := Links([]string{filepath.Join("testdata", "README.md")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, strings.TrimPrefix(p.String(), filepath.Join("testdata", "README.md")))
	}
	want := []string{
		`:6: link "docs/gone.md": docs/gone.md does not exist`,
		`:6: link "docs/page.md#no-such-heading": page.md has no heading #no-such-heading`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSlug guards the anchors links are checked against: GitHub's.
func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		" The data path":                              "the-data-path",
		" `make bench`":                               "make-bench",
		" Scaling, partitions and upgrades":           "scaling-partitions-and-upgrades",
		" The console's topic":                        "the-consoles-topic",
		" Schema Registry: the Confluent wire format": "schema-registry-the-confluent-wire-format",
		" [Link](x.md) and_under":                     "link-and_under",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCommandsFixture guards what counts as a command shown: shell blocks
// (continued lines joined) and code spans, a sub-verb for the verbs that
// have one, flags up to a shell operator; not Python blocks, not topic
// names.
func TestCommandsFixture(t *testing.T) {
	cmds, err := Commands([]string{filepath.Join("testdata", "README.md")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cmds {
		got = append(got, strings.Join(c.Verb, " ")+": "+strings.Join(c.Flags, ","))
	}
	want := []string{
		"produce: topic,file",
		"produce: no-such-flag",
		"policy whatif: policy,since,format",
		"tail: topic,from-beginning",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
