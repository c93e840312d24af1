package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// notYetMeasured are the modes added to make bench since docs/benchmarks.md
// was last generated: the next `make bench` writes their rows. Remove each
// here then (the test fails while a listed mode has its row).
var notYetMeasured = map[string]bool{}

// docs/benchmarks.md is what make bench writes: headed by docHeader, its
// figures between the markers in the form writeDoc gives them, with a row for
// every mode the generator names and a benchstat line for every row.
func TestBenchmarksDocIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, docHeader) {
		t.Errorf("docs/benchmarks.md does not start with the header cmd/bench writes:\n%s", docHeader)
	}
	i, j := strings.Index(doc, docBegin), strings.Index(doc, docEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/benchmarks.md lacks the %s … %s markers", docBegin, docEnd)
	}
	gen := doc[i+len(docBegin) : j]
	// It leads with the run's goal lines, the same as its summary's.
	h, k := strings.Index(doc, headBegin), strings.Index(doc, headEnd)
	if h < 0 || k < h || h > i {
		t.Fatalf("docs/benchmarks.md lacks the %s … %s markers before the figures", headBegin, headEnd)
	}
	if head, want := goalLines(doc[h:k]), goalLines(gen); len(want) == 0 || strings.Join(head, "\n") != strings.Join(want, "\n") {
		t.Errorf("the headline lists the goal lines\n%s\nwant those of the figures below:\n%s", strings.Join(head, "\n"), strings.Join(want, "\n"))
	}
	if !regexp.MustCompile("^\n\nMeasured [0-9-]+ [0-9:]+ UTC by `make bench`").MatchString(gen) {
		t.Errorf("the generated part does not open with writeDoc's `Measured … by make bench` line: edited by hand?")
	}
	for _, mode := range []string{modeHandlerSDK, modeHandlerDirect, modeHandlerRoom, modeDecodeV1, modeDecodeStrict, modeJoinV1, modeJoinStrict,
		modeFloor, modeNoSend, modeSend, modePureDB, modeTextbook, modeBatch, modeBatchOf, modeNoFlag, modeCatalog, modeStack, modeStackNoRoom, modeHot, modeHotNoBus} {
		has := strings.Contains(gen, "  "+mode)
		switch {
		case !has && !notYetMeasured[mode]:
			t.Errorf("docs/benchmarks.md has no %q row: it is stale, run make bench", mode)
		case has && notYetMeasured[mode]:
			t.Errorf("docs/benchmarks.md has a %q row now: remove it from notYetMeasured", mode)
		}
	}
	// One benchstat line per table row, as print writes them.
	table := strings.SplitN(gen, "```", 3)
	if len(table) < 3 {
		t.Fatal("the generated part has no ``` table")
	}
	rows, benches := 0, 0
	row := regexp.MustCompile(`^\S.*  \s*[0-9]+  +\S+  +\S+  `)
	for _, l := range strings.Split(table[1], "\n") {
		switch {
		case strings.HasPrefix(l, "Benchmark"):
			benches++
		case row.MatchString(l) && !strings.HasPrefix(l, "group "):
			rows++
		}
	}
	if rows == 0 || rows != benches {
		t.Errorf("the generated table has %d rows and %d benchstat lines: edited by hand?", rows, benches)
	}
}

// A rerun rewrites only what lies between the markers and keeps the header,
// once, whether or not the report had it.
func TestSpliceDocKeepsTheHandWrittenParts(t *testing.T) {
	if _, err := spliceBetween("no markers", headBegin, headEnd, "x"); err == nil {
		t.Error("spliceBetween on a document without the markers succeeded, want an error")
	}
	for _, doc := range []string{
		"# b\nintro\n" + docBegin + "\nold figures\n" + docEnd + "\nnotes\n",
		docHeader + "# b\nintro\n" + docBegin + "\nold figures\n" + docEnd + "\nnotes\n",
	} {
		got, err := spliceDoc(doc, "new figures\n")
		if err != nil {
			t.Fatal(err)
		}
		want := docHeader + "# b\nintro\n" + docBegin + "\n\nnew figures\n\n" + docEnd + "\nnotes\n"
		if got != want {
			t.Errorf("spliceDoc(%q) =\n%q, want\n%q", doc, got, want)
		}
	}
	if _, err := spliceDoc("# no markers\n", "x"); err == nil {
		t.Error("spliceDoc of a report without markers succeeded")
	}
}
