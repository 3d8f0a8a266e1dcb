package mqtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCasesDeclareTheHooksAndFlagsTheyRead keeps each case's Hooks and Flags true to
// its code: they must be exactly the Harness hooks (h.Fill, h.tooLarge(), ...) and
// Caps flags (h.Caps.X) that its run and skip funcs read, directly or through the
// package's helpers.
func TestCasesDeclareTheHooksAndFlagsTheyRead(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}

	hooks := map[string]bool{}
	for _, f := range fieldsOf[Harness]() {
		hooks[f] = f != "New" && f != "Caps"
	}
	reads := map[string]map[string]bool{} // func or "m:"+method -> what it reads
	refs := map[string]map[string]bool{}  // func or "m:"+method -> funcs and methods it names
	type entry struct{ run, skip string }
	entries := map[string]entry{}
	for _, file := range files {
		for _, decl := range file.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			key := fd.Name.Name
			if fd.Recv != nil {
				key = "m:" + key
			}
			r, n := map[string]bool{}, map[string]bool{}
			reads[key], refs[key] = r, n
			var visit func(ast.Node) bool
			visit = func(node ast.Node) bool {
				switch x := node.(type) {
				case *ast.SelectorExpr:
					if isHarness(x.X) && hooks[x.Sel.Name] || isHarness(x.X) && x.Sel.Name == "tooLarge" {
						r[strings.ToUpper(x.Sel.Name[:1])+x.Sel.Name[1:]] = true
					}
					if caps, ok := x.X.(*ast.SelectorExpr); ok && caps.Sel.Name == "Caps" && isHarness(caps.X) {
						r["Caps."+x.Sel.Name] = true
					}
					n["m:"+x.Sel.Name] = true
					ast.Inspect(x.X, visit)
					return false
				case *ast.Ident:
					n[x.Name] = true
				case *ast.CompositeLit:
					if arr, ok := x.Type.(*ast.ArrayType); ok && isIdent(arr.Elt, "testCase") {
						for _, el := range x.Elts {
							var name string
							var e entry
							for _, kv := range el.(*ast.CompositeLit).Elts {
								kv := kv.(*ast.KeyValueExpr)
								switch key := kv.Key.(*ast.Ident).Name; key {
								case "name":
									name, _ = strconv.Unquote(kv.Value.(*ast.BasicLit).Value)
								case "run", "skip":
									id, ok := kv.Value.(*ast.Ident)
									require.True(t, ok, "%s: a case's %s must name a func", fset.Position(kv.Pos()), key)
									if key == "run" {
										e.run = id.Name
									} else {
										e.skip = id.Name
									}
								}
							}
							entries[name] = e
						}
						return false
					}
				}
				return true
			}
			ast.Inspect(fd.Body, visit)
		}
	}
	closure := func(roots ...string) map[string]bool {
		out, seen := map[string]bool{}, map[string]bool{}
		var walk func(string)
		walk = func(k string) {
			if seen[k] || reads[k] == nil {
				return
			}
			seen[k] = true
			for r := range reads[k] {
				out[r] = true
			}
			for n := range refs[k] {
				walk(n)
			}
		}
		for _, r := range roots {
			walk(r)
		}
		return out
	}
	for _, c := range Cases() {
		e, ok := entries[c.Name]
		if !assert.True(t, ok, "%s: no table entry found in the source", c.Name) {
			continue
		}
		var gotHooks, gotFlags []string
		for r := range closure(e.run, e.skip) {
			if flag, ok := strings.CutPrefix(r, "Caps."); ok {
				gotFlags = append(gotFlags, flag)
			} else {
				gotHooks = append(gotHooks, r)
			}
		}
		slices.Sort(gotHooks)
		slices.Sort(gotFlags)
		assert.Equal(t, gotHooks, sorted(c.Hooks), "%s: hooks declared and hooks read", c.Name)
		assert.Equal(t, gotFlags, sorted(c.Flags), "%s: flags declared and flags read", c.Name)
	}
}

// isHarness reports whether x is the harness as cases name it: h or e.h.
func isHarness(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name == "h"
	case *ast.SelectorExpr:
		return x.Sel.Name == "h"
	}
	return false
}

func isIdent(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == name
}

func sorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return out
}
