package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocExamples parses every rule example of the documentation: each YAML
// block of docs/rules.md (a complete file as it is, a fragment, a
// descriptor list item, under a domain), and each YAML block that starts
// with "domain:" in README.md and the other docs/*.md files.
func TestDocExamples(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	parsed := 0
	for _, path := range append(docs, "../README.md") {
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		allRules := filepath.Base(path) == "rules.md"
		for i, b := range strings.Split(string(doc), "```yaml\n")[1:] {
			text, _, _ := strings.Cut(b, "```")
			switch {
			case strings.HasPrefix(text, "domain:"):
			case allRules:
				text = "domain: example\ndescriptors:\n" + text
			default:
				continue // an Envoy or Kubernetes example, checked in package examples
			}
			if _, err := Parse([]File{{Name: "example.yaml", Data: []byte(text)}}, Options{}); err != nil {
				t.Errorf("%s, YAML example %d: %v\n%s", path, i+1, err, text)
			}
			parsed++
		}
	}
	if parsed < 4 {
		t.Fatalf("parsed %d rule examples in the docs, want at least 4", parsed)
	}
}
