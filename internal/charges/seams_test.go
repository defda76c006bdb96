package charges_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The core and the payment domain, the packages a reader copies: they speak
// Go and their own types. HTTP, stripe-go and the generated rows stay in
// the adapters and the stores (docs/lifecycle.md; README, "Layout").
var seamPackages = map[string]string{
	"github.com/idempay/idempay/internal/idempotency":  "../idempotency",
	"github.com/idempay/idempay/internal/charges":      ".",
	"github.com/idempay/idempay/internal/stripeevents": "../stripeevents",
	"github.com/idempay/idempay/internal/reconcile":    "../reconcile",
}

// Imported by none of them, directly or not.
var neverImported = []string{"net/http", "github.com/labstack/echo/v4", "github.com/stripe/stripe-go/v76"}

// Named by none of their exported types, functions, methods, fields or
// variables: they may use the generated rows inside, never show them.
var neverShown = append([]string{"github.com/idempay/idempay/internal/dbsqlc"}, neverImported...)

// TestSeams keeps the core and the domain free of the HTTP stack, of
// stripe-go and, in what they export, of sqlc's generated rows, whatever
// a change adds: `go list -deps` for the imports, the parsed source for
// the signatures.
func TestSeams(t *testing.T) {
	t.Parallel()
	for pkg := range seamPackages {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for dep := range strings.FieldsSeq(string(out)) {
			for _, banned := range neverImported {
				if dep == banned || strings.HasPrefix(dep, banned+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	for pkg, dir := range seamPackages {
		for _, leak := range exportedMentions(t, dir) {
			t.Errorf("%s: %s", pkg, leak)
		}
	}
}

// exportedMentions lists each exported declaration in the package in dir
// (tests left out) whose signature names a package of neverShown.
func exportedMentions(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var leaks []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		banned := map[string]string{} // the file's name for each banned import
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, b := range neverShown {
				if path == b || strings.HasPrefix(path, b+"/") {
					local := filepath.Base(path)
					if imp.Name != nil {
						local = imp.Name.Name
					}
					banned[local] = path
				}
			}
		}
		if len(banned) == 0 {
			continue
		}
		check := func(what string, pos token.Pos, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && banned[x.Name] != "" {
						leaks = append(leaks, fset.Position(pos).String()+": "+what+" names "+x.Name+"."+sel.Sel.Name)
					}
				}
				return true
			})
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedReceiver(d.Recv)) {
					check("func "+d.Name.Name, d.Pos(), d.Type)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							checkType(s.Name.Name, s.Pos(), s.Type, check)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								check(n.Name, n.Pos(), s.Type)
							}
						}
					}
				}
			}
		}
	}
	return leaks
}

// checkType checks what an exported type shows: its exported fields and
// methods, or the whole of any other type expression.
func checkType(name string, pos token.Pos, typ ast.Expr, check func(string, token.Pos, ast.Node)) {
	var fields *ast.FieldList
	switch tt := typ.(type) {
	case *ast.StructType:
		fields = tt.Fields
	case *ast.InterfaceType:
		fields = tt.Methods
	default:
		check("type "+name, pos, typ)
		return
	}
	for _, f := range fields.List {
		if len(f.Names) == 0 { // embedded: shown whole
			check("type "+name, f.Pos(), f.Type)
		}
		for _, n := range f.Names {
			if n.IsExported() {
				check(name+"."+n.Name, n.Pos(), f.Type)
			}
		}
	}
}

func exportedReceiver(recv *ast.FieldList) bool {
	typ := recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.IsExported()
}
