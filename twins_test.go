package pgrelay_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// publicPackages are the module's public packages, by directory; every
// package under internal/ is compared with them.
var publicPackages = []string{".", "relay", "consumer", "broker", "broker/*", "guard", "httpidem", "otelpgrelay"}

// knownTwins are the twins not yet retired, internal name → public name,
// each with its reason. Add none: define the type once instead.
var knownTwins = map[string]string{}

// structType is an exported struct type of one package: its exported
// fields as "name type", sorted, package qualifiers dropped.
type structType struct {
	pkg, name string
	fields    []string
}

// TestNoTwinTypes: each concept has one type. An exported struct type of an
// internal package with the same exported fields (names and types, package
// qualifiers dropped) as an exported struct type of a public package is a
// twin: the two need converters and tests keeping them in step. Define the
// type once, in the public package, and use it from the engine.
func TestNoTwinTypes(t *testing.T) {
	t.Parallel()
	var public, internal []structType
	for _, pattern := range publicPackages {
		dirs, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range dirs {
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
				public = append(public, structTypes(t, dir)...)
			}
		}
	}
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		internal = append(internal, structTypes(t, path)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(public) < 20 {
		t.Fatalf("found only %d exported struct types in the public packages: is the test run from the module root?", len(public))
	}
	for _, in := range internal {
		for _, pub := range public {
			if slices.Equal(in.fields, pub.fields) && knownTwins[in.pkg+"."+in.name] != pub.pkg+"."+pub.name {
				t.Errorf("%s.%s is a twin of %s.%s: the same fields %v", in.pkg, in.name, pub.pkg, pub.name, in.fields)
			}
		}
	}
	t.Logf("%d public and %d internal exported struct types compared", len(public), len(internal))
}

// structTypes returns the exported struct types declared in dir's non-test
// Go files that have exported fields, with those fields.
func structTypes(t *testing.T, dir string) []structType {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []structType
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() || ts.Assign.IsValid() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok || len(st.Fields.List) == 0 {
				return true
			}
			var fields []string
			for _, fld := range st.Fields.List {
				typ := typeText(fld.Type)
				if len(fld.Names) == 0 { // embedded: named after its type
					if base := strings.TrimPrefix(typ, "*"); ast.IsExported(base) {
						fields = append(fields, base+" "+typ)
					}
				}
				for _, id := range fld.Names {
					if id.IsExported() {
						fields = append(fields, id.Name+" "+typ)
					}
				}
			}
			if len(fields) == 0 { // a service's handle, nothing to copy
				return true
			}
			slices.Sort(fields)
			out = append(out, structType{pkg: f.Name.Name, name: ts.Name.Name, fields: fields})
			return true
		})
	}
	return out
}

// typeText prints a field's type with package qualifiers dropped, so that
// event.Message and Message compare equal.
func typeText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.StarExpr:
		return "*" + typeText(e.X)
	case *ast.ArrayType:
		if e.Len == nil {
			return "[]" + typeText(e.Elt)
		}
		return "[n]" + typeText(e.Elt)
	case *ast.MapType:
		return "map[" + typeText(e.Key) + "]" + typeText(e.Value)
	case *ast.ChanType:
		return "chan " + typeText(e.Value)
	case *ast.FuncType:
		return "func"
	case *ast.InterfaceType:
		return "interface"
	case *ast.StructType:
		return "struct"
	case *ast.IndexExpr:
		return typeText(e.X) + "[" + typeText(e.Index) + "]"
	case *ast.Ellipsis:
		return "..." + typeText(e.Elt)
	}
	return "?"
}
