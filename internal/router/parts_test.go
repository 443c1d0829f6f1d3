package router

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Guards "a reader can name the part each file belongs to": every source
// file of the package is named in parts.go's list of parts and in the
// table of them in docs/data-path.md.
func TestEveryFileHasAPart(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	parts, err := os.ReadFile("parts.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "data-path.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	from, to := strings.Index(text, "| part | files | type |"), strings.Index(text, "The parts meet at small interfaces")
	if from < 0 || to < from {
		t.Fatal("docs/data-path.md: the table of the router's parts is missing")
	}
	table := text[from:to]
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if !strings.Contains(string(parts), f) {
			t.Errorf("%s: not in parts.go's list of parts", f)
		}
		if !strings.Contains(table, "`"+f+"`") {
			t.Errorf("%s: not in docs/data-path.md's table of parts", f)
		}
	}
}
