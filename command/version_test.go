package command

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/buildinfo"
)

// TestVersionOfADevelopmentBuild: a binary make release did not build (this
// test binary, as go build or make build in a clone without tags) prints the
// source's semantic version, the one CHANGELOG.md's latest entry names
// (internal/buildinfo's TestReleaseIsTheChangelogsLatest), and says it is a
// development build; the JSON report carries both.
func TestVersionOfADevelopmentBuild(t *testing.T) {
	var text bytes.Buffer
	if err := writeVersion(&text, "text"); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(text.String(), "\n")
	if want := "kube-etcd-migrate " + buildinfo.Release + " (a development build"; !strings.HasPrefix(first, want) {
		t.Errorf("version's first line %q, want it to start %q", first, want)
	}
	var js bytes.Buffer
	if err := writeVersion(&js, "json"); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Version     string `json:"version"`
		Development bool   `json:"development"`
	}
	if err := json.Unmarshal(js.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Version != buildinfo.Release || !v.Development {
		t.Errorf("version -o json: version %q development %v, want %s and true\n%s", v.Version, v.Development, buildinfo.Release, js.String())
	}
}
