package command

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// One truth for exit codes: exitCodes (exit.go) is what --help prints; these
// tests fail when docs/commands.md's table, the runbooks' "N: ..." notes or the
// code drift from it.

// docExitRows reads the "Exit codes" table of docs/commands.md: one row per
// code and commands, the meaning as exitCodes has it (Markdown's backticks
// dropped).
func docExitRows(t *testing.T) []exitCodeRow {
	t.Helper()
	text := readDoc(t, "../docs/commands.md")
	_, section, ok := strings.Cut(text, "\n## Exit codes\n")
	if !ok {
		t.Fatal("docs/commands.md has no '## Exit codes' section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var rows []exitCodeRow
	for _, l := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) != 3 || !strings.HasPrefix(l, "|") {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "`", ""))
		}
		code, err := strconv.Atoi(cells[0])
		if err != nil {
			continue // the header and its rule
		}
		var cmds []string
		if cells[1] == "every command" {
			cmds = everyCmd
		} else {
			cmds = strings.Split(cells[1], ", ")
		}
		rows = append(rows, exitCodeRow{Code: code, Commands: cmds, Meaning: cells[2]})
	}
	return rows
}

// docRow is a row as docs/commands.md writes it.
func docRow(r exitCodeRow) string {
	who := "every command"
	if !slices.Equal(r.Commands, everyCmd) {
		var q []string
		for _, c := range r.Commands {
			q = append(q, "`"+c+"`")
		}
		who = strings.Join(q, ", ")
	}
	return fmt.Sprintf("| %d | %s | %s |", r.Code, who, r.Meaning)
}

// TestExitCodesDocumented: docs/commands.md's exit-code table lists exactly
// exitCodes' rows, in order, with the same words; every command of the app has
// its 0, 1 (any error) and 2 (usage); exitCodes names no command the app lacks;
// each command's --help ends with its own rows.
func TestExitCodesDocumented(t *testing.T) {
	got := docExitRows(t)
	var want, have []string
	for _, r := range exitCodes {
		want = append(want, docRow(r))
	}
	for _, r := range got {
		have = append(have, strings.ReplaceAll(docRow(r), "`", ""))
	}
	for i := range want {
		want[i] = strings.ReplaceAll(want[i], "`", "")
	}
	if strings.Join(have, "\n") != strings.Join(want, "\n") {
		var gen []string
		for _, r := range exitCodes {
			gen = append(gen, docRow(r))
		}
		t.Errorf("docs/commands.md's exit-code table is not exitCodes; it should read:\n| code | commands | meaning |\n|---|---|---|\n%s\n\nit reads:\n%s",
			strings.Join(gen, "\n"), strings.Join(have, "\n"))
	}

	app := newApp(io.Discard, io.Discard)
	var names []string
	for _, c := range app.Commands {
		names = append(names, c.Name)
		codes := map[int]bool{}
		for _, r := range exitCodesFor(c.Name) {
			if codes[r.Code] {
				t.Errorf("%s: exit %d has two rows", c.Name, r.Code)
			}
			codes[r.Code] = true
		}
		for _, must := range []int{exitOK, exitError, exitUsage} {
			if !codes[must] {
				t.Errorf("%s: exitCodes has no row for exit %d", c.Name, must)
			}
		}
		code, stdout, _ := runCLI(t, c.Name, "--help")
		if code != exitOK || !strings.HasSuffix(strings.TrimSpace(stdout), strings.TrimSpace(exitCodesHelp(c.Name))) {
			t.Errorf("%s --help (exit %d) does not end with its exit codes:\n%s", c.Name, code, stdout)
		}
	}
	for _, r := range exitCodes {
		for _, n := range r.Commands {
			if !slices.Contains(names, n) {
				t.Errorf("exitCodes: exit %d names %q, not a command of the app", r.Code, n)
			}
		}
	}
	if code, stdout, _ := runCLI(t, "--help"); code != exitOK || !strings.Contains(stdout, exitCodesHelp("")) {
		t.Errorf("--help does not show every exit code")
	}
}

// exitConsts are the exit-code constants a command's code can name, but 0.
var exitConsts = map[string]int{"exitError": exitError, "exitUsage": exitUsage, "exitStale": exitStale, "exitUnreadable": exitUnreadable, "exitWriter": exitWriter, "exitInternal": exitInternal, "exitSignal": exitSignal}

// body is a function's body and the package names its file imports.
type body struct {
	block   *ast.BlockStmt
	imports map[string]bool
}

// reachableCodes parses the package and returns, per command name, the exit
// constants named in the functions its Action reaches (calls, and functions
// passed as values; methods by name; not other packages' functions), and in
// guarded, which newApp wraps every Action in: the codes it can return.
func reachableCodes(t *testing.T) map[string]map[int]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string][]body{}
	actions := map[string]body{} // command name -> its Action
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		imports := map[string]bool{}
		for _, im := range file.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = true
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				funcs[fd.Name.Name] = append(funcs[fd.Name.Name], body{fd.Body, imports})
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if sel, ok := cl.Type.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Command" {
				return true
			}
			var name string
			var action ast.Expr
			for _, e := range cl.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch k, _ := kv.Key.(*ast.Ident); {
				case k == nil:
				case k.Name == "Name":
					if lit, ok := kv.Value.(*ast.BasicLit); ok {
						name, _ = strconv.Unquote(lit.Value)
					}
				case k.Name == "Action":
					action = kv.Value
				}
			}
			switch a := action.(type) {
			case *ast.Ident:
				actions[name] = body{&ast.BlockStmt{List: []ast.Stmt{&ast.ExprStmt{X: a}}}, imports}
			case *ast.FuncLit:
				actions[name] = body{a.Body, imports}
			}
			return true
		})
	}
	out := map[string]map[int]bool{}
	for name, action := range actions {
		codes := map[int]bool{}
		seen := map[string]bool{}
		queue := append([]body{action}, funcs["guarded"]...)
		for len(queue) > 0 {
			fn := queue[0]
			queue = queue[1:]
			ast.Inspect(fn.block, func(n ast.Node) bool {
				var id string
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if pkg, ok := x.X.(*ast.Ident); ok && fn.imports[pkg.Name] {
						return false // another package's
					}
					return true
				case *ast.Ident:
					id = x.Name
				default:
					return true
				}
				if c, ok := exitConsts[id]; ok {
					codes[c] = true
				}
				if !seen[id] {
					seen[id] = true
					queue = append(queue, funcs[id]...)
				}
				return true
			})
		}
		out[name] = codes
	}
	return out
}

// TestExitCodesReturned: every exit code a command's code can return (the
// constants named in what its Action reaches) has a row of exitCodes for that
// command, and every row beyond 0, 1 and 2 is one its code can return.
func TestExitCodesReturned(t *testing.T) {
	reach := reachableCodes(t)
	app := newApp(io.Discard, io.Discard)
	for _, c := range app.Commands {
		codes, ok := reach[c.Name]
		if !ok {
			t.Errorf("%s: no Action found in the source", c.Name)
			continue
		}
		rows := map[int]bool{}
		for _, r := range exitCodesFor(c.Name) {
			rows[r.Code] = true
			if r.Code > exitUsage && !codes[r.Code] {
				t.Errorf("%s: exitCodes documents exit %d, which its code never returns", c.Name, r.Code)
			}
		}
		for code := range codes {
			if !rows[code] {
				t.Errorf("%s: its code can exit %d, which exitCodes does not document for it", c.Name, code)
			}
		}
	}
	// The walk finds what it must: migrate reaches all of them.
	for _, code := range []int{exitError, exitUsage, exitStale, exitUnreadable, exitInternal, exitSignal} {
		if !reach["migrate"][code] {
			t.Errorf("the source walk does not find exit %d in migrate: it is broken", code)
		}
	}
}

// codeNoteRE finds the exit codes of a runbook note: "0: ...", "0 or 3: ...",
// "1 / 4: ...", "1 with "...": ...", "1 about ...".
var codeNoteRE = regexp.MustCompile(`(?:^|[\s(])(\d{1,3}(?:\s*(?:or|/|,)\s*\d{1,3})*)(?::|\s+with\s|\s+about\s)`)

// codeNote is the exit codes a note in a shell block gives for a command.
type codeNote struct {
	where, command string
	codes          []int
}

// codeNotes finds, in the shell blocks of a page, the exit codes noted after
// each kube-etcd-migrate command line: in its trailing comment, and in the
// indented comment lines ("#   0: ...") below it.
func codeNotes(path, text string, app interface{ isCommand(string) bool }) []codeNote {
	blocks, _ := splitFences(text)
	var out []codeNote
	for _, b := range blocks {
		if !shellLang(b.lang) {
			continue
		}
		current := ""
		for i := 0; i < len(b.lines); i++ {
			start := i
			line := b.lines[i]
			for strings.HasSuffix(line, `\`) && i+1 < len(b.lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + " " + b.lines[i]
			}
			trimmed := strings.TrimSpace(line)
			note := ""
			if inv := invocations("", line); len(inv) > 0 {
				current = ""
				for _, w := range inv[len(inv)-1].words {
					if app.isCommand(w) {
						current = w
						break
					}
				}
				at := strings.LastIndex(line, toolName)
				if j := strings.Index(line[at:], " #"); j >= 0 {
					note = line[at+j:]
				}
			} else if strings.HasPrefix(trimmed, "#  ") {
				note = trimmed
			} else {
				current = "" // a step heading, or another command
				continue
			}
			if current == "" || note == "" {
				continue
			}
			for _, m := range codeNoteRE.FindAllStringSubmatch(note, -1) {
				var codes []int
				for _, f := range regexp.MustCompile(`\d+`).FindAllString(m[1], -1) {
					n, _ := strconv.Atoi(f)
					codes = append(codes, n)
				}
				out = append(out, codeNote{where: fmt.Sprintf("%s:%d", path, b.line+start), command: current, codes: codes})
			}
		}
	}
	return out
}

type appCommands map[string]bool

func (a appCommands) isCommand(w string) bool { return a[w] }

// TestRunbookExitCodes: every exit code the runbooks (and README, and every
// page's shell blocks) note after a kube-etcd-migrate command is one that
// exitCodes documents for that command.
func TestRunbookExitCodes(t *testing.T) {
	cmds := appCommands{}
	for _, c := range newApp(io.Discard, io.Discard).Commands {
		cmds[c.Name] = true
	}
	found := map[string]int{}
	for _, path := range docFiles(t) {
		for _, n := range codeNotes(path, readDoc(t, path), cmds) {
			found[n.command]++
			rows := map[int]bool{}
			for _, r := range exitCodesFor(n.command) {
				rows[r.Code] = true
			}
			for _, c := range n.codes {
				if !rows[c] {
					t.Errorf("%s: %s exits %d, which exitCodes does not document for it", n.where, n.command, c)
				}
			}
		}
	}
	// The runbooks note codes after verify, migrate, quarantine and rollback:
	// finding none means the extraction broke.
	var seen []string
	for c := range found {
		seen = append(seen, c)
	}
	sort.Strings(seen)
	for _, c := range []string{"verify", "migrate", "quarantine", "rollback"} {
		if found[c] == 0 {
			t.Errorf("no exit-code note found after a %s command line in the docs (found: %v): the extraction broke", c, seen)
		}
	}
}

// TestRunbookExitCodesCatchMistakes: the note finder reads each form the
// runbooks use, and not the numbers of prose.
func TestRunbookExitCodesCatchMistakes(t *testing.T) {
	page := "```sh\n" +
		"# 1. A step, 2 things: not a note.\n" +
		"sudo kube-etcd-migrate verify --apiserver-manifest $M   # 3: stale\n" +
		"#   0: current.   4: unreadable (listed).\n" +
		"#   0 or 3: go on.   1 / 4: as in (a) step 5.\n" +
		"kube-etcd-migrate quarantine --resource secrets \\\n    --reason undecryptable --journal j\n" +
		"#   1 with \"a kube-apiserver is alive\": stop it.   1 about etcd's quota, 4: listed.\n" +
		"#      (watches etcd for 15 s: no code)\n" +
		"echo done\n" +
		"#   7: after another command: not a note\n" +
		"```\n"
	var got []string
	for _, n := range codeNotes("page.md", page, appCommands{"verify": true, "quarantine": true}) {
		got = append(got, fmt.Sprint(n.command, n.codes))
	}
	want := "verify[3] verify[0] verify[4] verify[0 3] verify[1 4] quarantine[1] quarantine[1] quarantine[4]"
	if strings.Join(got, " ") != want {
		t.Errorf("notes found: %s\nwant: %s", strings.Join(got, " "), want)
	}
}
