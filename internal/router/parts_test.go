package router

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Guards "the import graph is the parts table": docs/data-path.md's table of
// the router's parts names every file of this package and every package
// under it, and its last column is exactly what each part's package imports
// of the other parts. A part that starts to reach into another (or stops)
// changes the graph, and the table must say so.
func TestThePartsTableIsTheImportGraph(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "data-path.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	from := strings.Index(text, "| part | where | entered through | uses parts |")
	if from < 0 {
		t.Fatal("docs/data-path.md: the table of the router's parts is missing")
	}
	table := text[from:]
	if end := strings.Index(table, "\n\n"); end > 0 {
		table = table[:end]
	}
	const module = "github.com/faultrouter/faultrouter/internal/router/"
	pkgRe, fileRe := regexp.MustCompile("package `internal/router/(\\w+)`"), regexp.MustCompile("`(\\w+\\.go)`")
	named := map[string]bool{}    // files of this package the table names
	uses := map[string][]string{} // part package -> the parts the table says it uses
	for _, row := range strings.Split(table, "\n")[2:] {
		cells := strings.Split(row, "|")
		if len(cells) != 6 {
			t.Fatalf("docs/data-path.md: a row of the parts table without its four columns: %q", row)
		}
		for _, m := range fileRe.FindAllStringSubmatch(cells[2], -1) {
			named[m[1]] = true
		}
		if m := pkgRe.FindStringSubmatch(cells[2]); m != nil {
			var u []string
			for _, p := range strings.Split(strings.TrimSpace(cells[4]), ",") {
				if p = strings.TrimSpace(p); p != "" && p != "none" {
					u = append(u, p)
				}
			}
			slices.Sort(u)
			uses[m[1]] = u
		}
	}

	// every file of the package has its row
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") && !named[f] {
			t.Errorf("%s: not in docs/data-path.md's table of parts", f)
		}
	}
	// every part package has its row, and the row says what it imports
	dirs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	parts := 0
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		imports := partImports(t, d.Name(), module)
		if imports == nil {
			continue // no Go package
		}
		parts++
		want, ok := uses[d.Name()]
		if !ok {
			t.Errorf("package internal/router/%s: not in docs/data-path.md's table of parts", d.Name())
			continue
		}
		got := imports[1:]
		if !slices.Equal(got, want) {
			t.Errorf("package internal/router/%s imports the parts %v; docs/data-path.md's table says %v", d.Name(), got, want)
		}
	}
	if parts == 0 || len(uses) != parts {
		t.Errorf("%d part packages under internal/router, %d in docs/data-path.md's table", parts, len(uses))
	}
}

// partImports returns, for the package in dir, "" followed by the sorted
// names of the packages under module it imports (non-test files); nil when
// dir holds no Go package.
func partImports(t *testing.T, dir, module string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if out == nil {
			out = []string{""}
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if name, ok := strings.CutPrefix(p, module); ok && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	if out != nil {
		slices.Sort(out[1:])
	}
	return out
}
