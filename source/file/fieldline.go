package file

import (
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// fieldLine returns the line, counted from data's first line, of the field
// at path (spec.ports[0].port, metadata.labels[kubernetes.io/service-name])
// in the YAML document data, within items[item] when item >= 0. A field
// that is not in the document (a required one left out) gives the line of
// the deepest part of its path that is; 0 when data does not parse.
func fieldLine(data []byte, item int, path string) int {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return 0
	}
	n := doc.Content[0]
	line := n.Line
	segs := pathSegments(path)
	if item >= 0 {
		segs = append([]string{"items", "[" + strconv.Itoa(item) + "]"}, segs...)
	}
	for _, s := range segs {
		var at int
		if n, at = child(n, s); n == nil {
			break
		}
		line = at
	}
	return line
}

// pathSegments cuts a field path into keys and [index] or [key] parts.
func pathSegments(path string) []string {
	var out []string
	for path != "" {
		switch {
		case path[0] == '.':
			path = path[1:]
		case path[0] == '[':
			end := strings.IndexByte(path, ']')
			if end < 0 {
				return append(out, path)
			}
			out = append(out, path[:end+1])
			path = path[end+1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			out = append(out, path[:end])
			path = path[end:]
		}
	}
	return out
}

// child is the node seg names in n, a mapping's value by key (for a [key]
// part too) or a sequence's item by [index], and the line it is named on:
// the key's, or the item's.
func child(n *yaml.Node, seg string) (*yaml.Node, int) {
	key := seg
	if strings.HasPrefix(seg, "[") && strings.HasSuffix(seg, "]") {
		key = seg[1 : len(seg)-1]
		if i, err := strconv.Atoi(key); err == nil && n.Kind == yaml.SequenceNode {
			if i >= 0 && i < len(n.Content) {
				return n.Content[i], n.Content[i].Line
			}
			return nil, 0
		}
	}
	if n.Kind != yaml.MappingNode {
		return nil, 0
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1], n.Content[i].Line
		}
	}
	return nil, 0
}
