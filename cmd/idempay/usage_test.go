package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/dbtest"
)

// dispatched is every command the binary dispatches, read from its source:
// the string cases of the switches on args[0] (and on args[0] + " " +
// args[1]) and the comparisons with args[0], in the functions that
// dispatch, each with the command its arguments follow. A command word
// that only leads to subcommands (orders, charges ...) is left out: its
// subcommands are listed.
func dispatched(t *testing.T) map[string]bool {
	t.Helper()
	prefix := map[string]string{"run": "", "wantsHelp": "", "clientCmd": "",
		"accountsCmd": "accounts ", "ordersCmd": "orders ", "webhooksCmd": "webhooks "}
	fset := token.NewFileSet()
	found := map[string]bool{}
	// The binary's own files, and the one package it links that reads a
	// variable itself: telemetry, for the OpenTelemetry SDK's switch.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	telemetry, err := filepath.Glob(filepath.Join(repoRoot, "internal", "telemetry", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, telemetry...)
	isArgs := func(e ast.Expr) bool {
		s := types.ExprString(e)
		return s == "args[0]" || s == `args[0] + " " + args[1]`
	}
	add := func(fn string, lit ast.Expr) {
		if b, ok := lit.(*ast.BasicLit); ok && b.Kind == token.STRING {
			v, _ := strconv.Unquote(b.Value)
			found[prefix[fn]+v] = true
		}
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if _, dispatches := prefix[fd.Name.Name]; !dispatches {
				continue
			}
			fn := fd.Name.Name
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SwitchStmt:
					if n.Tag != nil && isArgs(n.Tag) {
						for _, c := range n.Body.List {
							for _, e := range c.(*ast.CaseClause).List {
								add(fn, e)
							}
						}
					}
				case *ast.BinaryExpr:
					if (n.Op == token.EQL || n.Op == token.NEQ) && isArgs(n.X) {
						add(fn, n.Y)
					}
				}
				return true
			})
		}
	}
	for c := range found {
		if head, _, ok := strings.Cut(c, " "); ok {
			delete(found, head)
		}
	}
	return found
}

// commandWord is a subcommand list in a usage line: create|get|list.
var commandWord = regexp.MustCompile(`^[a-z][a-z|-]*$`)

// listed is the commands of the usage lines in text that start with
// lead: the syntax before the first run of two spaces, whose first word is
// the command and whose second, when it is a word or words joined by |,
// its subcommands.
func listed(text, lead string) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, lead)
		if !ok {
			continue
		}
		syntax, _, _ := strings.Cut(strings.TrimSpace(rest), "  ")
		words := strings.Fields(syntax)
		if len(words) == 0 {
			continue
		}
		if len(words) < 2 || !commandWord.MatchString(words[1]) {
			out[words[0]] = true
			continue
		}
		for _, sub := range strings.Split(words[1], "|") {
			out[words[0]+" "+sub] = true
		}
	}
	return out
}

func sorted(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }

// TestHelpListsEveryCommand: `idempay --help` lists every command the
// binary dispatches, subcommands included (charges capture and cancel were
// missing), and nothing it does not; docs/configuration.md lists the same.
func TestHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	want := dispatched(t)
	if !want["reconcile"] || !want["charges capture"] || !want["accounts create"] || !want["webhooks trigger"] {
		t.Fatalf("reading the dispatch from the source found only %v", sorted(want))
	}
	stdout, _, code := idempay(t, nil, "--help")
	if code != 0 {
		t.Fatalf("idempay --help: exit %d", code)
	}
	_, commands, _ := strings.Cut(stdout, "commands:\n")
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, docCommands, _ := strings.Cut(string(doc), "# Commands")
	for where, got := range map[string]map[string]bool{
		"idempay --help":        listed(commands, "  "),
		"docs/configuration.md": listed(docCommands, "idempay "),
	} {
		for _, c := range sorted(want) {
			if !got[c] {
				t.Errorf("%s does not list %q, which idempay runs", where, c)
			}
		}
		for _, c := range sorted(got) {
			if !want[c] {
				t.Errorf("%s lists %q, which idempay does not run", where, c)
			}
		}
	}
}

// envRead finds the environment variables the binary reads: through
// loadConfig's reader (e.str, e.int, e.dur, e.bool) or os.Getenv and
// os.LookupEnv, with the name as a literal.
var envRead = regexp.MustCompile(`(?:\be\.(?:str|int|dur|bool)|os\.Getenv|os\.LookupEnv)\("([A-Z][A-Z0-9_]*)"`)

// docVariable is a variable in the first column of configuration.md's
// table, alone or with others: | `A`, `B` | ...
var docVariable = regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")

// TestConfigurationDocListsEveryVariable: every environment variable the
// binary reads has a row in docs/configuration.md, and every row names a
// variable it reads (a row left behind by a removed setting fails too).
func TestConfigurationDocListsEveryVariable(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	// The binary's own files, and the one package it links that reads a
	// variable itself: telemetry, for the OpenTelemetry SDK's switch.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	telemetry, err := filepath.Glob(filepath.Join(repoRoot, "internal", "telemetry", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, telemetry...)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range envRead.FindAllStringSubmatch(string(src), -1) {
			read[m[1]] = true
		}
	}
	if !read["DATABASE_URL"] || !read["IDEMPAY_API_KEY"] || !read["PPROF_ADDR"] {
		t.Fatalf("reading the source found only %v", sorted(read))
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range docVariable.FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	for _, v := range sorted(read) {
		if !documented[v] {
			t.Errorf("docs/configuration.md has no row for %s, which idempay reads", v)
		}
	}
	for _, v := range sorted(documented) {
		if !read[v] {
			t.Errorf("docs/configuration.md has a row for %s, which idempay does not read", v)
		}
	}
}

// TestAccountsCreatePrintsWhatHelpSays: `accounts create` prints one JSON
// object with exactly the fields --help and docs/configuration.md name.
func TestAccountsCreatePrintsWhatHelpSays(t *testing.T) {
	t.Parallel()
	const fields = `{"id","name","api_key"}`
	help, _, _ := idempay(t, nil, "--help")
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help, "accounts create --name N                 create an account; prints one JSON object, "+fields) ||
		!strings.Contains(string(doc), "prints one JSON object, "+fields) {
		t.Fatalf("--help or docs/configuration.md no longer say that accounts create prints %s", fields)
	}
	dbtest.Pool(t) // creates and migrates the package's database
	stdout, stderr, code := idempay(t, []string{"DATABASE_URL=" + dbtest.URL()}, "accounts", "create", "--name", "help test")
	var got map[string]any
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&got); code != 0 || err != nil || dec.More() {
		t.Fatalf("accounts create: exit %d, stdout %q, stderr %q; want one JSON object", code, stdout, stderr)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []string{"api_key", "id", "name"}) {
		t.Errorf("accounts create printed the fields %v, want those of %s", keys, fields)
	}
}
