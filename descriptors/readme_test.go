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

// TestDocErrorSample: the error sample of docs/rules.md is what loading
// testdata/docs/rules prints, every problem of every file, the second
// definition of a domain included, in order.
func TestDocErrorSample(t *testing.T) {
	doc, err := os.ReadFile("../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "every problem of every file is reported at")
	if !ok {
		t.Fatal("docs/rules.md no longer has the error sample")
	}
	_, block, _ := strings.Cut(after, "```\n")
	want, _, _ := strings.Cut(block, "```")
	_, err = Load(filepath.Join("testdata", "docs", "rules"), Options{})
	if err == nil {
		t.Fatal("the sample's files loaded")
	}
	var got strings.Builder
	for _, line := range strings.Split(err.Error(), "\n") {
		got.WriteString(strings.ReplaceAll(line, filepath.Join("testdata", "docs")+string(filepath.Separator), "") + "\n")
	}
	if got.String() != want {
		t.Errorf("loading testdata/docs/rules:\n%s\ndocs/rules.md shows:\n%s", got.String(), want)
	}
}
