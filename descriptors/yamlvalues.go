package descriptors

import (
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// resolve follows aliases to the node they name.
func (r *reader) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// fields calls fn for each field of the mapping n, in order, after checking
// that every key is a string, allowed and not repeated.
func (r *reader) fields(n *yaml.Node, allowed []string, fn func(name string, key, val *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := r.resolve(n.Content[i]), r.resolve(n.Content[i+1])
		if key.Kind == yaml.ScalarNode && key.ShortTag() == "!!merge" {
			r.errorf(key.Line, "config error, YAML merge keys (<<) are not supported")
			continue
		}
		if key.Kind != yaml.ScalarNode || key.ShortTag() != "!!str" {
			r.errorf(key.Line, "config error, key is not of type string: %s", describe(key))
			continue
		}
		if !slices.Contains(allowed, key.Value) {
			r.errorf(key.Line, "config error, unknown key '%s'", key.Value)
			continue
		}
		if first, dup := seen[key.Value]; dup {
			r.errorf(key.Line, "config error, duplicate key '%s' (first at line %d)", key.Value, first)
			continue
		}
		seen[key.Value] = key.Line
		fn(key.Value, key, val)
	}
}

// describe renders a node for an error message.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "an alias"
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// list returns the mapping items of a list field, reporting other items.
func (r *reader) list(field string, n *yaml.Node) []*yaml.Node {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		r.errorf(n.Line, "config error, %s must be a list, got %s", field, describe(n))
		return nil
	}
	var items []*yaml.Node
	for _, it := range n.Content {
		it = r.resolve(it)
		r.nodes++
		if r.nodes > maxNodes {
			if !r.tooLarge {
				r.errorf(it.Line, "config error, more than %d descriptors and list items (YAML aliases?)", maxNodes)
				r.tooLarge = true
			}
			return items
		}
		if it.Kind != yaml.MappingNode {
			r.errorf(it.Line, "config error, yaml file contains list of type other than map: %s", describe(it))
			continue
		}
		items = append(items, it)
	}
	return items
}

// mapping checks that n is a mapping; null reports false without error.
func (r *reader) mapping(field string, n *yaml.Node) bool {
	if isNull(n) {
		return false
	}
	if n.Kind != yaml.MappingNode {
		r.errorf(n.Line, "config error, %s must be a mapping, got %s", field, describe(n))
		return false
	}
	return true
}

func (r *reader) str(field string, n *yaml.Node) (string, bool) {
	if isNull(n) {
		return "", true
	}
	if n.Kind != yaml.ScalarNode {
		r.errorf(n.Line, "config error, %s must be a string, got %s", field, describe(n))
		return "", false
	}
	return n.Value, true
}

func (r *reader) boolean(field string, n *yaml.Node) bool {
	var b bool
	if isNull(n) {
		return false
	}
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		r.errorf(n.Line, "config error, %s must be true or false, got %s", field, describe(n))
	}
	return b
}

// unsigned reads a non-negative integer no larger than max.
func (r *reader) unsigned(field string, n *yaml.Node, max uint64) (uint64, bool) {
	var u uint64
	if n.Kind != yaml.ScalarNode || n.Decode(&u) != nil || u > max {
		r.errorf(n.Line, "config error, %s must be an integer between 0 and %d, got %s", field, max, describe(n))
		return 0, false
	}
	return u, true
}

func (r *reader) duration(field string, n *yaml.Node) (time.Duration, bool) {
	s, ok := r.str(field, n)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		r.errorf(n.Line, "config error, %s must be a positive duration such as 30s or 5m, got '%s'", field, s)
		return 0, false
	}
	return d, true
}
