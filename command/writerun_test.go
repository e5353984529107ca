package command

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestWritesThroughWriterun: no command file takes the cluster's lock, opens
// a run directory, starts a liveness watch or builds a first write itself:
// every writing command hands its stage to writerun, which does them in
// their one order.
// ownedPackages are the packages of a writing run that writerun owns: the
// cluster's lock, the run's record and undo, the guards and the watch.
var ownedPackages = map[string]bool{"clusterlock": true, "undo": true, "guard": true, "liveness": true}

func TestWritesThroughWriterun(t *testing.T) {
	owned := map[string]map[string]bool{
		"clusterlock": {"Acquire": true, "Holder": true, "Reclaim": true},
		"guard":       {"StartWatch": true, "FirstWrite": true},
		"undo":        {"OpenJournal": true},
	}
	methods := map[string]bool{"NewRun": true, "BeginCommand": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// The lock, the run record, the watch and the undo are reached
		// through writerun only (go list -deps: command -> writerun -> them).
		for _, imp := range file.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if owner := strings.TrimPrefix(path, "kube-etcd-migrate/"); owner != path && ownedPackages[owner] {
				t.Errorf("%s: imports %s: the command line reaches a writing run's lock, record, watch and undo through writerun only", fset.Position(imp.Pos()), path)
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && owned[pkg.Name][sel.Sel.Name] {
				t.Errorf("%s: %s.%s: a writing run's step taken outside writerun", fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name)
			}
			if methods[sel.Sel.Name] {
				t.Errorf("%s: .%s: a run directory or journal opened outside writerun", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
}
