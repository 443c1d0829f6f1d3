package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRuleNamesHaveOneHome guards the rule names' one home: every rule the
// package decides with is a constant of rules.go or review.go (no string
// literal is assigned to a decision's rule elsewhere), and no two constants
// spell the same rule.
func TestRuleNamesHaveOneHome(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec: // a Rule constant
				for i, id := range n.Names {
					if !strings.HasPrefix(id.Name, "Rule") || i >= len(n.Values) {
						continue
					}
					lit, ok := n.Values[i].(*ast.BasicLit)
					if !ok {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					if other, dup := seen[v]; dup {
						t.Errorf("%s and %s both spell rule %q", other, id.Name, v)
					}
					seen[v] = id.Name
				}
			case *ast.KeyValueExpr: // rule: "..." or Rule: "..."
				if k, ok := n.Key.(*ast.Ident); ok && strings.EqualFold(k.Name, "rule") {
					if _, lit := n.Value.(*ast.BasicLit); lit {
						t.Errorf("%s: a rule spelled as a literal; name it in rules.go", fset.Position(n.Pos()))
					}
				}
			case *ast.AssignStmt: // v.rule = "..." or d.Rule = "..."
				for i, l := range n.Lhs {
					if s, ok := l.(*ast.SelectorExpr); ok && strings.EqualFold(s.Sel.Name, "rule") && i < len(n.Rhs) {
						if _, lit := n.Rhs[i].(*ast.BasicLit); lit {
							t.Errorf("%s: a rule spelled as a literal; name it in rules.go", fset.Position(n.Pos()))
						}
					}
				}
			}
			return true
		})
	}
	if len(seen) < 30 {
		t.Errorf("found %d rule constants, want every rule of rules.go and review.go", len(seen))
	}
}
