package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/buildinfo"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeReport writes a report through write, its own writer, and for "json" and
// "yaml" adds a "build" object first (the tool's version, the Kubernetes release
// whose codecs judged the objects, etcd client and Go versions), so that a report
// kept for an audit says which release produced it. Other formats are written
// unchanged.
func writeReport(w io.Writer, format string, write func(w io.Writer, format string) error) error {
	if format != "json" && format != "yaml" {
		return write(w, format)
	}
	var buf bytes.Buffer
	if err := write(&buf, "json"); err != nil {
		return err
	}
	data, err := stampBuild(buf.Bytes())
	if err != nil {
		return err
	}
	if format == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
	}
	_, err = w.Write(data)
	return err
}

// stampBuild returns the JSON object report with "build" as its first member,
// indented; the report's own members keep their order.
func stampBuild(report []byte) ([]byte, error) {
	report = bytes.TrimSpace(report)
	if len(report) < 2 || report[0] != '{' || !json.Valid(report) {
		return nil, fmt.Errorf("report is not a JSON object: %.40q", report)
	}
	stamp, err := json.Marshal(struct {
		Build buildinfo.Info `json:"build"`
	}{buildinfo.Get()})
	if err != nil {
		return nil, err
	}
	merged := stamp[:len(stamp)-1] // without its closing brace
	if rest := bytes.TrimSpace(report[1:]); len(rest) > 0 && rest[0] != '}' {
		merged = append(merged, ',')
	}
	merged = append(merged, report[1:]...)
	var out bytes.Buffer
	if err := json.Indent(&out, merged, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
