package descriptors

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeExamples parses every YAML example of README-section.md: a
// complete file as it is, a fragment (a descriptor list item) under a domain.
func TestReadmeExamples(t *testing.T) {
	doc, err := os.ReadFile("README-section.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```yaml\n")[1:]
	if len(blocks) < 3 {
		t.Fatalf("found %d YAML examples, want at least 3", len(blocks))
	}
	for i, b := range blocks {
		text, _, _ := strings.Cut(b, "```")
		if !strings.HasPrefix(text, "domain:") {
			text = "domain: example\ndescriptors:\n" + text
		}
		if _, err := Parse([]File{{Name: "example.yaml", Data: []byte(text)}}); err != nil {
			t.Errorf("example %d: %v\n%s", i+1, err, text)
		}
	}
}
