package advise

import (
	"bytes"
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Candidate is the running policy file (running; empty for the built-in
// policy) with the proposals written into it: each max_retries and
// min_confidence proposal as an entry of `overrides` (its name, its match
// and the one key it changes in its class's section), each SLA proposal in
// `owners`. An override already in the file with the same match gets the
// key instead of a second entry (two such entries would tie); one that
// sets breaker limits alone decides no event and does not take it.
// A new entry starts from the sections of the file's override that decides
// its events today (the most specific one whose match holds the new one):
// a narrower override replaces that one for its events, and would otherwise
// drop its settings. The file's other keys and its comments are kept.
func Candidate(running []byte, proposals []Proposal) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(running, &doc); err != nil {
		return nil, fmt.Errorf("advise: the running policy file: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	root := doc.Content[0]
	for i := range proposals {
		p := &proposals[i]
		value := scalar(strconv.FormatFloat(p.Change.To, 'f', -1, 64))
		value.Tag = "!!int"
		if p.Kind == KindMinConfidence {
			value.Tag = "!!float"
		}
		if p.Kind == KindOwnerSLA {
			owners := child(root, "owners", yaml.MappingNode)
			owner := child(owners, p.Owner, yaml.MappingNode)
			owner.Style = yaml.FlowStyle
			set(owner, "sla_ms", value)
			continue
		}
		overrides := child(root, "overrides", yaml.SequenceNode)
		entry := sameMatch(overrides, *p.Match)
		if entry == nil {
			entry = &yaml.Node{Kind: yaml.MappingNode, HeadComment: "proposed by faultrouter policy advise: " + p.Evidence.Text}
			set(entry, "name", scalar(uniqueName(overrides, p.Name)))
			m := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
			for _, kv := range [][2]string{{"provider", p.Match.Provider}, {"model", p.Match.Model}, {"action", p.Match.Action}, {"prompt_template", p.Match.PromptTemplate}} {
				v := scalar(kv[1])
				if kv[1] == "*" {
					v.Style = yaml.DoubleQuotedStyle
				}
				set(m, kv[0], v)
			}
			set(entry, "match", m)
			if from := deciding(overrides, *p.Match); from != nil {
				entry.HeadComment += "\n(the other settings are those of override " + get(from, "name") + ", which decided these events)"
				for i := 0; i+1 < len(from.Content); i += 2 {
					if k := from.Content[i].Value; k != "name" && k != "match" && k != "breakers" { // breaker limits are per key, not per event
						set(entry, k, deepCopy(from.Content[i+1]))
					}
				}
			}
			overrides.Content = append(overrides.Content, entry)
		}
		sec := child(entry, p.Change.Section, yaml.MappingNode)
		sec.Style = yaml.FlowStyle
		set(sec, p.Change.Key, value)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("advise: writing the candidate: %w", err)
	}
	return b.Bytes(), enc.Close()
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

// child is the value of key in mapping m, added (of kind) when missing.
func child(m *yaml.Node, key string, kind yaml.Kind) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := m.Content[i+1]
			if v.Kind != kind { // null or another shape: replaced
				*v = yaml.Node{Kind: kind}
			}
			return v
		}
	}
	v := &yaml.Node{Kind: kind}
	m.Content = append(m.Content, scalar(key), v)
	return v
}

// set sets key of mapping m to v.
func set(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, scalar(key), v)
}

// get is the scalar value of key in mapping m, "" when missing.
func get(m *yaml.Node, key string) string {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1].Value
		}
	}
	return ""
}

// sameMatch is the entry of overrides whose match equals m (a missing key
// or "*" is any), nil when none.
func sameMatch(overrides *yaml.Node, m Match) *yaml.Node {
	for _, e := range overrides.Content {
		if om, ok := matchOf(e); ok && om == m && decides(e) {
			return e
		}
	}
	return nil
}

// matchOf is the match of override entry e (a missing key is "*"), false
// when e has none.
func matchOf(e *yaml.Node) (Match, bool) {
	if e.Kind != yaml.MappingNode {
		return Match{}, false
	}
	var mm *yaml.Node
	for i := 0; i+1 < len(e.Content); i += 2 {
		if e.Content[i].Value == "match" {
			mm = e.Content[i+1]
		}
	}
	if mm == nil || mm.Kind != yaml.MappingNode {
		return Match{}, false
	}
	any := func(key string) string {
		if v := get(mm, key); v != "" {
			return v
		}
		return "*"
	}
	return Match{any("provider"), any("model"), any("action"), any("prompt_template")}, true
}

// deciding is the entry of overrides that decides the events of m today:
// the most specific one whose match holds every event m selects; nil when
// none does (the base policy decides them).
func deciding(overrides *yaml.Node, m Match) *yaml.Node {
	var best *yaml.Node
	depth := 0
	for _, e := range overrides.Content {
		if om, ok := matchOf(e); ok && om.holds(m) && om.depth() > depth && decides(e) {
			best, depth = e, om.depth()
		}
	}
	return best
}

// decides reports whether override entry e changes a class section: one
// that sets breaker limits alone decides no event.
func decides(e *yaml.Node) bool {
	for i := 0; i+1 < len(e.Content); i += 2 {
		if k := e.Content[i].Value; k != "name" && k != "match" && k != "breakers" {
			return true
		}
	}
	return false
}

func deepCopy(n *yaml.Node) *yaml.Node {
	if n == nil {
		return nil
	}
	c := *n
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, x := range n.Content {
		c.Content[i] = deepCopy(x)
	}
	return &c
}

// uniqueName is name, or name-2, name-3... if an override has it.
func uniqueName(overrides *yaml.Node, name string) string {
	taken := map[string]bool{}
	for _, e := range overrides.Content {
		if e.Kind == yaml.MappingNode {
			taken[get(e, "name")] = true
		}
	}
	n, try := 1, name
	for taken[try] {
		n++
		try = name + "-" + strconv.Itoa(n)
	}
	return try
}
