// Package figures finds and rewrites the measured figures of the docs. A
// figure is a block of a Markdown file written by the command it names:
//
//	<!-- figures: COMMAND -->
//	_`COMMAND`: commit 1a2b3c4, 2026-12-02, <CPU> × 2, go1.26.8._
//
//	```text
//	COMMAND's output
//	```
//	<!-- /figures -->
//
// ("figures-md:" instead of "figures:" puts the output in as Markdown, for
// commands that print tables). `make figures` (cmd/figures) runs every
// command and rewrites its block; a test checks that every command names
// something that exists.
package figures

import (
	"fmt"
	"regexp"
	"strings"
)

// Block is one figure of a document.
type Block struct {
	// Command is the shell command that writes the figure, run from the
	// repository's root.
	Command string
	// Markdown reports whether the output goes in as Markdown (figures-md)
	// rather than in a text block.
	Markdown bool
	// Stamp is the block's stamp line ("" if it has none yet), and Body
	// what follows it up to the end marker.
	Stamp, Body string
	// start and end are the byte offsets of the block's content: after the
	// opening marker's line, before the end marker.
	start, end int
}

var (
	opening = regexp.MustCompile(`(?m)^<!-- figures(-md)?: (.+?) -->\n`)
	closing = "<!-- /figures -->"
)

// Parse returns the figure blocks of doc, in order, or an error naming the
// first block without its end marker.
func Parse(doc string) ([]Block, error) {
	var blocks []Block
	for _, m := range opening.FindAllStringSubmatchIndex(doc, -1) {
		b := Block{Command: doc[m[4]:m[5]], Markdown: m[2] >= 0, start: m[1]}
		end := strings.Index(doc[b.start:], closing)
		if end < 0 {
			return nil, fmt.Errorf("figures block %q has no %s", b.Command, closing)
		}
		b.end = b.start + end
		content := doc[b.start:b.end]
		if strings.HasPrefix(content, "_`") {
			b.Stamp, b.Body, _ = strings.Cut(content, "\n")
		} else {
			b.Body = content
		}
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// Stamp is the line above a figure: the command and where it ran.
func Stamp(command, commit, date, cpu, goVersion string) string {
	return fmt.Sprintf("_`%s`: commit %s, %s, %s, %s._", command, commit, date, cpu, goVersion)
}

// Rewrite returns doc with every block's content replaced by its stamp and
// the output render returns for it (blocks render skips with ok false keep
// their content).
func Rewrite(doc string, render func(Block) (stamp, output string, ok bool)) (string, error) {
	blocks, err := Parse(doc)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	last := 0
	for _, b := range blocks {
		stamp, output, ok := render(b)
		if !ok {
			continue
		}
		out.WriteString(doc[last:b.start])
		out.WriteString(stamp + "\n\n")
		output = strings.TrimRight(output, "\n") + "\n"
		if b.Markdown {
			out.WriteString(output)
		} else {
			out.WriteString("```text\n" + output + "```\n")
		}
		last = b.end
	}
	out.WriteString(doc[last:])
	return out.String(), nil
}
