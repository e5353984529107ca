package command

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/urfave/cli/v2"
)

// The documentation's own tests: what README.md and docs/*.md show must still
// run. Every relative link resolves (the file, and the heading a #fragment
// names), and every kube-etcd-migrate command line in their shell blocks (and
// the "$ kube-etcd-migrate ..." lines of their transcripts) names a command
// and only flags that command has, as the app defines them (newApp), not as
// a copy here lists them.

const toolName = "kube-etcd-migrate"

// docFiles are the README, the changelog and every page under docs/ (tests run
// in command/).
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no ../docs/*.md")
	}
	return append([]string{"../README.md", "../CHANGELOG.md"}, pages...)
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// codeBlock is a fenced block: its info string and its lines.
type codeBlock struct {
	lang  string
	line  int // of its first line, 1-based
	lines []string
}

// splitFences returns the fenced code blocks of a Markdown text and the text
// with them blanked (for the links and headings outside code).
func splitFences(text string) (blocks []codeBlock, prose []string) {
	var cur *codeBlock
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			if cur == nil {
				cur = &codeBlock{lang: strings.TrimSpace(strings.TrimPrefix(l, "```")), line: i + 2}
			} else {
				blocks = append(blocks, *cur)
				cur = nil
			}
			prose = append(prose, "")
			continue
		}
		if cur != nil {
			cur.lines = append(cur.lines, l)
			prose = append(prose, "")
			continue
		}
		prose = append(prose, l)
	}
	return blocks, prose
}

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces turned into hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var headingRE = regexp.MustCompile(`^#{1,6} (.+)$`)

// anchors are the fragments a page's headings define (a repeated heading gets
// -1, -2, ... as on GitHub).
func anchors(text string) map[string]bool {
	_, prose := splitFences(text)
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range prose {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var (
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	inlineCodeRE = regexp.MustCompile("`[^`]*`")
)

// brokenLinks lists the relative links of the page at path that do not
// resolve: a missing file, or a fragment no heading of the target defines.
func brokenLinks(path, text string) []string {
	_, prose := splitFences(text)
	var bad []string
	for i, l := range prose {
		for _, m := range linkRE.FindAllStringSubmatch(inlineCodeRE.ReplaceAllString(l, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			where := fmt.Sprintf("%s:%d: %s", path, i+1, target)
			if file == "" {
				if !anchors(text)[frag] {
					bad = append(bad, where+": no heading #"+frag)
				}
				continue
			}
			targetPath := filepath.Join(filepath.Dir(path), file)
			if _, err := os.Stat(targetPath); err != nil {
				bad = append(bad, where+": no such file")
				continue
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(targetPath, ".md") {
				bad = append(bad, where+": a fragment of a file that is not Markdown")
				continue
			}
			b, err := os.ReadFile(targetPath)
			if err != nil {
				bad = append(bad, where+": "+err.Error())
				continue
			}
			if !anchors(string(b))[frag] {
				bad = append(bad, where+": no heading #"+frag+" in "+targetPath)
			}
		}
	}
	return bad
}

// commandLine is one kube-etcd-migrate invocation shown in a page.
type commandLine struct {
	where string
	words []string // after the program name, up to the end of the command
}

// shellLang says whether a fence's info string is a shell.
func shellLang(lang string) bool {
	switch lang {
	case "sh", "bash", "shell", "console", "zsh":
		return true
	}
	return false
}

// commandLines finds the invocations in a page: every one in a shell block
// (comments included: they show commands too), and the "$ kube-etcd-migrate"
// lines of other blocks (transcripts).
func commandLines(path, text string) []commandLine {
	blocks, _ := splitFences(text)
	var out []commandLine
	for _, b := range blocks {
		shell := shellLang(b.lang)
		for i := 0; i < len(b.lines); i++ {
			start := i
			line := b.lines[i]
			for strings.HasSuffix(line, `\`) && i+1 < len(b.lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + " " + b.lines[i]
			}
			if !shell {
				if !strings.HasPrefix(line, "$ "+toolName+" ") && line != "$ "+toolName {
					continue
				}
				line = strings.TrimPrefix(line, "$ ")
			}
			out = append(out, invocations(fmt.Sprintf("%s:%d", path, b.line+start), line)...)
		}
	}
	return out
}

// invocations splits the words of a shell line at each kube-etcd-migrate and
// ends each at what ends a command (a pipe, a list operator, a redirection, a
// comment, a closing parenthesis).
func invocations(where, line string) []commandLine {
	words := strings.Fields(line)
	var out []commandLine
	for i := 0; i < len(words); i++ {
		w := strings.TrimLeft(words[i], "#$(<`")
		if w != toolName && w != toolName+")" {
			continue
		}
		var args []string
		if w == toolName {
			for _, a := range words[i+1:] {
				if a == "|" || a == "||" || a == "&&" || a == ";" || strings.HasPrefix(a, "#") ||
					strings.HasPrefix(a, ">") || strings.HasPrefix(a, "2>") || strings.HasPrefix(a, "<") {
					break
				}
				end := strings.HasSuffix(a, ")") || strings.HasSuffix(a, ";")
				a = strings.TrimRight(a, ");")
				if a != "" {
					args = append(args, a)
				}
				if end {
					break
				}
			}
		}
		out = append(out, commandLine{where: where, words: args})
	}
	return out
}

// flagNames are the names and aliases of flags, with help's.
func flagNames(flags []cli.Flag) map[string]bool {
	names := map[string]bool{"help": true, "h": true}
	for _, f := range flags {
		for _, n := range f.Names() {
			names[n] = true
		}
	}
	return names
}

// checkInvocation says what is wrong with one command line against the app:
// an unknown command, or a flag the command does not define. Flags may come
// before the command name (they are the command's, or the app's own).
func checkInvocation(app *cli.App, words []string) error {
	// Which flags take a value, over every command (as args.go carries a
	// command's flags given before its name).
	all := append([]cli.Flag{}, app.Flags...)
	for _, c := range app.Commands {
		all = append(all, c.Flags...)
	}
	takes := flagIndex(all)
	var before []string
	i := 0
	for i < len(words) && isFlagWord(words[i]) {
		before = append(before, words[i])
		if name, inline := flagName(words[i]); takes[name] && !inline {
			i++
		}
		i++
	}
	if i > len(words) {
		return fmt.Errorf("%s needs a value", before[len(before)-1])
	}
	if i == len(words) {
		// No command: only the app's own flags (--version, --help).
		for _, f := range before {
			if !flagNames(app.Flags)[flagWordName(f)] && flagWordName(f) != "version" {
				return fmt.Errorf("%s without a command", f)
			}
		}
		return nil
	}
	cmd := app.Command(words[i])
	if cmd == nil {
		return fmt.Errorf("no command %q", words[i])
	}
	known := flagNames(cmd.Flags)
	for _, w := range append(before, words[i+1:]...) {
		if w == "--" {
			break
		}
		if !strings.HasPrefix(w, "-") || w == "-" {
			continue
		}
		if name := flagWordName(w); !known[name] {
			return fmt.Errorf("%s has no flag --%s", cmd.Name, name)
		}
	}
	return nil
}

func flagWordName(w string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
	return name
}

// TestDocLinksResolve: every relative link of README.md and docs/*.md leads
// to a file that exists and, with a #fragment, to a heading of it.
func TestDocLinksResolve(t *testing.T) {
	links := 0
	for _, path := range docFiles(t) {
		text := readDoc(t, path)
		_, prose := splitFences(text)
		for _, l := range prose {
			links += len(linkRE.FindAllString(l, -1))
		}
		for _, bad := range brokenLinks(path, text) {
			t.Error(bad)
		}
	}
	if links < 20 {
		t.Errorf("%d links in the docs: the link pattern no longer finds them", links)
	}
}

// TestDocCommandsUseRealFlags: every kube-etcd-migrate command line shown in
// README.md and docs/*.md (the runbooks' shell blocks above all) names a
// command of the app and only flags that command defines.
func TestDocCommandsUseRealFlags(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	perFile := map[string]int{}
	for _, path := range docFiles(t) {
		for _, c := range commandLines(path, readDoc(t, path)) {
			perFile[filepath.Base(path)]++
			if err := checkInvocation(app, c.words); err != nil {
				t.Errorf("%s: %s %s: %v", c.where, toolName, strings.Join(c.words, " "), err)
			}
		}
	}
	// The runbooks are shell blocks of commands: finding few means the
	// extraction broke, not that the docs are right.
	if perFile["runbooks.md"] < 20 {
		t.Errorf("found %d kube-etcd-migrate command lines in docs/runbooks.md, want at least 20", perFile["runbooks.md"])
	}
	if perFile["README.md"] < 3 {
		t.Errorf("found %d kube-etcd-migrate command lines in README.md, want at least 3", perFile["README.md"])
	}
}

// TestDocCheckersCatchMistakes runs the checkers above on pages with known
// mistakes: they must report each.
func TestDocCheckersCatchMistakes(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	page := "# Title\n\n## A `flag` (b) → c\n\n" +
		"```sh\n" +
		"sudo kube-etcd-migrate verify --apiserver-manifest $M --no-such-flag   # 3: stale\n" +
		"kube-etcd-migrate migrate --dry-run \\\n    --journal j --also-not-a-flag=1\n" +
		"source <(kube-etcd-migrate completion bash)\n" +
		"kube-etcd-migrate --endpoints x verify -o json | jq .\n" +
		"kube-etcd-migrate frobnicate\n" +
		"#   kube-etcd-migrate rollback --journal j   # 0: restored --not-checked-in-a-comment\n" +
		"```\n\n" +
		"```text\n$ kube-etcd-migrate inventory --bogus\nkube-etcd-migrate 4ae1ee3\n```\n"
	lines := commandLines("page.md", page)
	var got []string
	for _, c := range lines {
		if err := checkInvocation(app, c.words); err != nil {
			got = append(got, err.Error())
		}
	}
	want := []string{
		"verify has no flag --no-such-flag",
		"migrate has no flag --also-not-a-flag",
		`no command "frobnicate"`,
		"inventory has no flag --bogus",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors found in the sample page:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(lines) != 7 {
		t.Errorf("%d command lines found in the sample page, want 7: %v", len(lines), lines)
	}

	dir := t.TempDir()
	other := filepath.Join(dir, "other.md")
	if err := os.WriteFile(other, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	links := "[ok](other.md#a-flag-b--c) [ok](#t) [gone](missing.md) [bad](other.md#nope) [web](https://example.com/x)\n\n# T\n"
	bad := brokenLinks(filepath.Join(dir, "page.md"), links)
	if len(bad) != 2 || !strings.Contains(bad[0], "missing.md: no such file") || !strings.Contains(bad[1], "no heading #nope") {
		t.Errorf("broken links found: %q, want missing.md and #nope", bad)
	}
}
