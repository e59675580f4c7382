package figures

import (
	"strings"
	"testing"
)

func TestRewrite(t *testing.T) {
	doc := "intro\n<!-- figures: go run ./x -->\nold\n<!-- /figures -->\nmiddle\n<!-- figures-md: make y -->\n<!-- /figures -->\nend\n"
	blocks, err := Parse(doc)
	if err != nil || len(blocks) != 2 || blocks[0].Command != "go run ./x" || blocks[0].Markdown || !blocks[1].Markdown || blocks[0].Body != "old\n" {
		t.Fatalf("Parse: %+v %v", blocks, err)
	}
	got, err := Rewrite(doc, func(b Block) (string, string, bool) {
		if b.Command == "make y" {
			return Stamp(b.Command, "abc", "2026-12-02", "cpu × 2", "go1"), "| a |\n", true
		}
		return Stamp(b.Command, "abc", "2026-12-02", "cpu × 2", "go1"), "out\n", true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n<!-- figures: go run ./x -->\n_`go run ./x`: commit abc, 2026-12-02, cpu × 2, go1._\n\n```text\nout\n```\n<!-- /figures -->\nmiddle\n<!-- figures-md: make y -->\n_`make y`: commit abc, 2026-12-02, cpu × 2, go1._\n\n| a |\n<!-- /figures -->\nend\n"
	if got != want {
		t.Fatalf("Rewrite:\n%s\nwant:\n%s", got, want)
	}
	again, _ := Parse(got)
	if again[0].Stamp == "" || !strings.Contains(again[0].Body, "out") {
		t.Fatalf("a rewritten block: %+v", again[0])
	}
	if _, err := Parse("<!-- figures: x -->\nno end\n"); err == nil {
		t.Fatal("a block without its end marker parsed")
	}
}
