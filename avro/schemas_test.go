package avro

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"
)

func parse(t *testing.T, s Schema) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s.JSON), &m); err != nil {
		t.Fatalf("%s: %v", s.File, err)
	}
	return m
}

// TestSchemasLoad guards the embedded catalog: every schema composes, parses
// as Avro, each record has exactly one current version, and the included
// TaskEvent is defined once inside RoutedRecord, identical to its own file.
func TestSchemasLoad(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	current := map[string]int{}
	for _, s := range all {
		if _, err := goavro.NewCodec(s.JSON); err != nil {
			t.Errorf("%s v%d: %v", s.Name, s.Version, err)
		}
		if s.Current {
			current[s.Name]++
		}
	}
	for _, n := range []string{TaskEvent, RoutedRecord, BreakerEvent, ReviewDecision} {
		if current[n] != 1 {
			t.Errorf("%s has %d current versions", n, current[n])
		}
	}
	routed, err := Current(RoutedRecord)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(routed.JSON, `"name":"TaskEvent"`); n != 1 {
		t.Fatalf("RoutedRecord defines TaskEvent %d times", n)
	}
	te, _ := Current(TaskEvent)
	event := parse(t, routed)["fields"].([]any)[0].(map[string]any)["type"].([]any)[1]
	if !reflect.DeepEqual(event, parse(t, te)) {
		t.Fatal("RoutedRecord's TaskEvent differs from task_event.avsc")
	}
}

// TestNullableDefaults guards the rule that a nullable field is ["null", T]
// with default null, so that readers can always default it.
func TestNullableDefaults(t *testing.T) {
	all, _ := All()
	for _, s := range all {
		eachField(parse(t, s), "", func(path string, f map[string]any) {
			u, ok := f["type"].([]any)
			if !ok {
				return
			}
			if u[0] != "null" {
				t.Errorf("%s %s: a union's first branch must be null", s.File, path)
			}
			if d, has := f["default"]; !has || d != nil {
				t.Errorf("%s %s: a nullable field needs \"default\": null", s.File, path)
			}
		})
	}
}

// TestEvolutionRules guards avro/README.md's rules between consecutive
// versions of each record: a new field has a default, a field is removed only
// if it had a default, a rename carries an alias, and an enum only grows, and
// only when it has a default.
func TestEvolutionRules(t *testing.T) {
	all, _ := All()
	byName := map[string][]Schema{}
	for _, s := range all {
		byName[s.Name] = append(byName[s.Name], s)
	}
	for name, versions := range byName {
		sort.Slice(versions, func(i, j int) bool { return versions[i].Version < versions[j].Version })
		for i := 1; i < len(versions); i++ {
			old, cur := versions[i-1], versions[i]
			if cur.Version != old.Version+1 {
				t.Errorf("%s: version %d follows %d", name, cur.Version, old.Version)
			}
			for _, v := range checkEvolution(name, parse(t, old), parse(t, cur)) {
				t.Error(v)
			}
		}
	}
}

func checkEvolution(name string, old, cur map[string]any) (violations []string) {
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	oldF, curF := fieldMap(old), fieldMap(cur)
	for path, f := range curF {
		if _, ok := oldF[path]; ok || !hasParent(oldF, path) {
			continue // unchanged, or inside a new field that has its own default
		}
		aliased := false
		for _, a := range asSlice(f["aliases"]) {
			if _, ok := oldF[parentOf(path)+a.(string)]; ok {
				aliased = true
			}
		}
		if _, has := f["default"]; !has && !aliased {
			bad("%s: new field %s has no default", name, path)
		}
	}
	for path, f := range oldF {
		if _, ok := curF[path]; ok || !hasParent(curF, path) {
			continue
		}
		if _, has := f["default"]; !has && !renamed(curF, path) {
			bad("%s: field %s was removed without a default or renamed without an alias", name, path)
		}
	}
	oldE, curE := enums(old), enums(cur)
	for n, e := range oldE {
		c, ok := curE[n]
		if !ok {
			continue
		}
		os, cs := asSlice(e["symbols"]), asSlice(c["symbols"])
		for _, s := range os {
			if !slices.Contains(cs, s) {
				bad("%s: enum %s lost symbol %v", name, n, s)
			}
		}
		if len(cs) > len(os) && (e["default"] == nil || c["default"] == nil) {
			bad("%s: enum %s grew without a default", name, n)
		}
	}
	return violations
}

// TestEvolutionChecker guards the checker itself: each broken rule is caught,
// and a rename with an alias is not reported.
func TestEvolutionChecker(t *testing.T) {
	old := `{"type":"record","name":"R","fields":[
		{"name":"a","type":"string"},
		{"name":"b","type":"string"},
		{"name":"e","type":{"type":"enum","name":"E","symbols":["X"]}}]}`
	cur := `{"type":"record","name":"R","fields":[
		{"name":"a","type":"string"},
		{"name":"c","type":"string"},
		{"name":"e","type":{"type":"enum","name":"E","symbols":["X","Y"]}}]}`
	var o, c map[string]any
	if err := json.Unmarshal([]byte(old), &o); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(cur), &c); err != nil {
		t.Fatal(err)
	}
	got := checkEvolution("R", o, c)
	for _, w := range []string{"new field c has no default", "field b was removed", "enum E grew without a default"} {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, w) }) {
			t.Errorf("checker missed %q; got %q", w, got)
		}
	}
	aliased := strings.Replace(cur, `{"name":"c","type":"string"}`, `{"name":"c","aliases":["b"],"type":"string"}`, 1)
	c = nil
	if err := json.Unmarshal([]byte(aliased), &c); err != nil {
		t.Fatal(err)
	}
	for _, v := range checkEvolution("R", o, c) {
		if strings.Contains(v, "field b") || strings.Contains(v, "field c") {
			t.Errorf("an aliased rename was reported: %s", v)
		}
	}
}

func renamed(cur map[string]map[string]any, path string) bool {
	base := path[len(parentOf(path)):]
	for p, f := range cur {
		if parentOf(p) == parentOf(path) && slices.Contains(asSlice(f["aliases"]), any(base)) {
			return true
		}
	}
	return false
}

// hasParent reports whether the record holding path exists in fields.
func hasParent(fields map[string]map[string]any, path string) bool {
	p := parentOf(path)
	if p == "" {
		return true
	}
	_, ok := fields[strings.TrimSuffix(p, ".")]
	return ok
}

func parentOf(path string) string {
	if i := strings.LastIndex(path, "."); i >= 0 {
		return path[:i+1]
	}
	return ""
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func fieldMap(root map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	eachField(root, "", func(path string, f map[string]any) { out[path] = f })
	return out
}

// eachField calls fn for every field of every record under t, with its
// dotted path.
func eachField(t any, prefix string, fn func(string, map[string]any)) {
	switch t := t.(type) {
	case []any:
		for _, b := range t {
			eachField(b, prefix, fn)
		}
	case map[string]any:
		switch t["type"] {
		case "record":
			for _, f := range asSlice(t["fields"]) {
				fm := f.(map[string]any)
				p := prefix + fm["name"].(string)
				fn(p, fm)
				eachField(fm["type"], p+".", fn)
			}
		case "array":
			eachField(t["items"], prefix, fn)
		case "map":
			eachField(t["values"], prefix, fn)
		}
	}
}

func enums(t any) map[string]map[string]any {
	out := map[string]map[string]any{}
	var walk func(any)
	walk = func(t any) {
		switch t := t.(type) {
		case []any:
			for _, b := range t {
				walk(b)
			}
		case map[string]any:
			switch t["type"] {
			case "enum":
				out[t["name"].(string)] = t
			case "record":
				for _, f := range asSlice(t["fields"]) {
					walk(f.(map[string]any)["type"])
				}
			case "array":
				walk(t["items"])
			case "map":
				walk(t["values"])
			}
		}
	}
	walk(t)
	return out
}
