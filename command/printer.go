package command

import (
	"bytes"
	"encoding/json"
	"io"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/buildinfo"
)

// The printers, as etcdctl's (ctlv3/command/printer.go): the domain packages
// return report values (structs with JSON tags) and never print; each command
// hands its report to the printer of its --output format. One printer per
// format: table (the text for people: tables, notes, the verdict line), json
// (the report's value with a "build" member first: the tool's version, the
// Kubernetes release whose codecs judged the objects, etcd client and Go
// versions, so that a report kept for an audit says what produced it) and
// yaml (that JSON converted by sigs.k8s.io/yaml).

// report is one command's outcome as the printers take it.
type report interface {
	// table writes the form for people.
	table(w io.Writer) error
	// stamped is the value json and yaml marshal: a struct whose first
	// member is build (`json:"build"`), the report's own members after it.
	stamped(build buildinfo.Info) any
}

// printer writes a report in one output format.
type printer interface {
	print(w io.Writer, r report) error
}

// printerFor is the printer of an --output value; the flag has checked it
// (outputFlag): anything but json and yaml is the table.
func printerFor(format string) printer {
	switch format {
	case "json":
		return jsonPrinter{}
	case "yaml":
		return yamlPrinter{}
	}
	return tablePrinter{}
}

// printReport writes r as format.
func printReport(w io.Writer, format string, r report) error {
	return printerFor(format).print(w, r)
}

type tablePrinter struct{}

func (tablePrinter) print(w io.Writer, r report) error { return r.table(w) }

type jsonPrinter struct{}

func (jsonPrinter) print(w io.Writer, r report) error {
	return writeJSON(w, r.stamped(buildinfo.Get()))
}

type yamlPrinter struct{}

func (yamlPrinter) print(w io.Writer, r report) error {
	var buf bytes.Buffer
	if err := writeJSON(&buf, r.stamped(buildinfo.Get())); err != nil {
		return err
	}
	data, err := yaml.JSONToYAML(buf.Bytes())
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// writeJSON is v as JSON, indented by two spaces, with a final newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
