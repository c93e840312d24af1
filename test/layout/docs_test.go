package layout_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// citingDocs are the documents whose test names a reader is meant to find:
// each name they cite must be a test the repository has.
var citingDocs = []string{"README.md", "docs/ARCHITECTURE.md", "docs/design.md", "docs/operations.md"}

// testIndex is what the repository's _test.go files declare, read with
// go/parser (no build): every func TestXxx(t *testing.T), and per directory
// every string literal of its test files, where subtest names live (t.Run
// arguments, or the names of a table's cases), and those of the contract
// suites under internal/testkit.
type testIndex struct {
	dirOf   map[string][]string        // TestXxx → the directories declaring it
	strings map[string]map[string]bool // directory → its test files' string literals
}

func indexTests(t *testing.T, root string) testIndex {
	t.Helper()
	idx := testIndex{dirOf: map[string][]string{}, strings: map[string]map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		suite := strings.HasPrefix(filepath.ToSlash(path), filepath.ToSlash(filepath.Join(root, "internal/testkit"))+"/")
		if !strings.HasSuffix(path, "_test.go") && (!suite || !strings.HasSuffix(path, ".go")) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if suite {
			dir = suites
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && !suite && fn.Recv == nil && isTestFunc(fn) {
				idx.dirOf[fn.Name.Name] = append(idx.dirOf[fn.Name.Name], dir)
			}
		}
		lits := idx.strings[dir]
		if lits == nil {
			lits = map[string]bool{}
			idx.strings[dir] = lits
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					lits[s] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatalf("reading the test files: %v", err)
	}
	return idx
}

// isTestFunc reports whether fn is func TestXxx(t *testing.T), as go test
// finds it.
func isTestFunc(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if !strings.HasPrefix(name, "Test") || fn.Type.Params == nil || len(fn.Type.Params.List) != 1 {
		return false
	}
	if rest := name[len("Test"):]; rest != "" {
		if r, _ := utf8.DecodeRuneInString(rest); r >= 'a' && r <= 'z' {
			return false
		}
	}
	star, ok := fn.Type.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// suites stands for every directory of internal/testkit: the contract suites
// there run their subtests under tests declared elsewhere (TestLedgerContract
// runs reservationtest.Ledger), so their names count for every test.
const suites = "internal/testkit"

// hasSubtest reports whether a test file beside one of dirs holds a string
// that starts a subtest named sub (a citation may end in an ellipsis and so
// give only the start of the name).
func (idx testIndex) hasSubtest(dirs []string, sub string, prefix bool) bool {
	for _, dir := range append(append([]string(nil), dirs...), suites) {
		for s := range idx.strings[dir] {
			if s == sub || strings.ReplaceAll(s, " ", "_") == sub || (prefix && strings.HasPrefix(s, sub)) {
				return true
			}
		}
	}
	return false
}

// citation is a test name in a document: TestXxx, TestXxx/sub, or TestXxx
// "sub" (a subtest by its name), the name possibly cut short by an ellipsis
// (TestFault01…15, TestReview…, TestMetering "opening groups past…").
var citation = regexp.MustCompile(`\bTest[A-Z0-9][A-Za-z0-9_]*(/[^\s` + "`" + `,;)]+)?(…|\.\.\.)?(\s+"([^"]+)")?`)

func TestDocsCiteTestsThatExist(t *testing.T) {
	root := "../.."
	idx := indexTests(t, root)
	if len(idx.dirOf) < 100 {
		t.Fatalf("found only %d tests in the repository: the index is broken", len(idx.dirOf))
	}
	for _, doc := range citingDocs {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatalf("%v", err)
		}
		for lineNo, line := range strings.Split(string(text), "\n") {
			for _, m := range citation.FindAllStringSubmatch(line, -1) {
				whole, slash, ellipsis, quoted := m[0], m[1], m[2], m[4]
				name := strings.TrimSuffix(strings.TrimSuffix(whole, m[3]), ellipsis)
				name = strings.TrimSuffix(name, slash)
				where := doc + ":" + strconv.Itoa(lineNo+1)
				if ellipsis != "" && slash == "" {
					// A family of tests: some test must start with the name.
					found := false
					for test := range idx.dirOf {
						if strings.HasPrefix(test, name) {
							found = true
							break
						}
					}
					if !found {
						t.Errorf("%s cites %s…, and no test starts with %s", where, name, name)
					}
					continue
				}
				dirs, ok := idx.dirOf[name]
				if !ok {
					t.Errorf("%s cites %s, which no _test.go file declares", where, name)
					continue
				}
				if slash != "" {
					sub := strings.TrimPrefix(slash, "/")
					if !idx.hasSubtest(dirs, sub, ellipsis != "") {
						t.Errorf("%s cites %s%s, and no test file beside %s has a subtest %q", where, name, slash, name, sub)
					}
				}
				if quoted != "" {
					sub, cut := strings.CutSuffix(quoted, "…")
					if !cut {
						sub, cut = strings.CutSuffix(quoted, "...")
					}
					if !idx.hasSubtest(dirs, sub, cut) {
						t.Errorf("%s cites %s %q, and no test file beside %s has a subtest by that name", where, name, quoted, name)
					}
				}
			}
		}
	}
}

// maxSentence is the most words a sentence of the reference documents may
// have: one idea a sentence, so the protocol reads top to bottom.
const maxSentence = 40

// sentenceDocs are held to maxSentence, in their prose: code blocks, table
// rows and headings are not prose. The sections of sentenceSkips are not
// held yet (another rewrite owns "One SKU over K buckets").
var (
	sentenceDocs  = []string{"docs/ARCHITECTURE.md", "docs/design.md"}
	sentenceSkips = map[string]bool{"## One SKU over K buckets": true}
)

// sentence is one sentence of a document's prose: its words, and the line
// it starts on.
type sentence struct {
	line  int
	words []string
}

// proseSentences splits a markdown document's prose into sentences. A
// paragraph or a list item is joined across its lines; a sentence ends at a
// word that ends in '.', '?' or '!' (before any closing quote, parenthesis,
// backtick or emphasis).
func proseSentences(text string) []sentence {
	var out []sentence
	var cur sentence
	end := func() {
		if len(cur.words) > 0 {
			out = append(out, cur)
		}
		cur = sentence{}
	}
	code, skip := false, false
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			end()
			code = !code
			continue
		case code:
			continue
		case strings.HasPrefix(trimmed, "#"):
			end()
			skip = sentenceSkips[trimmed]
			continue
		case skip:
			continue
		case trimmed == "" || strings.HasPrefix(trimmed, "|"):
			end()
			continue
		}
		if m := listItem.FindString(trimmed); m != "" {
			end()
			trimmed = trimmed[len(m):]
		}
		for _, w := range strings.Fields(trimmed) {
			if len(cur.words) == 0 {
				cur.line = i + 1
			}
			cur.words = append(cur.words, w)
			if strings.ContainsAny(lastRune(strings.TrimRight(w, "\"')]*_`")), ".?!") {
				end()
			}
		}
	}
	end()
	return out
}

var listItem = regexp.MustCompile(`^([*-]|\d+\.)\s+`)

func lastRune(s string) string {
	r, _ := utf8.DecodeLastRuneInString(s)
	return string(r)
}

func TestReferenceDocsHaveShortSentences(t *testing.T) {
	for _, doc := range sentenceDocs {
		text, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatalf("%v", err)
		}
		sentences := proseSentences(string(text))
		if len(sentences) < 50 {
			t.Fatalf("%s: found only %d sentences: the splitter is broken", doc, len(sentences))
		}
		for _, s := range sentences {
			if len(s.words) > maxSentence {
				t.Errorf("%s:%d has a sentence of %d words (at most %d: one idea a sentence): %q",
					doc, s.line, len(s.words), maxSentence, strings.Join(s.words[:12], " ")+" …")
			}
		}
	}
}
