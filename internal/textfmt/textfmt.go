// Package textfmt holds the few text helpers every layer's messages share, so
// that each has one behaviour: an error or message on one line (etcd, YAML and
// gRPC errors span lines; the tool's errors and reports are one line each),
// a list of named values joined, and a size in binary units. It imports
// nothing of the module.
package textfmt

import (
	"fmt"
	"strings"
)

// OneLine is s with every run of white space, newlines included, made one
// space, and no leading or trailing space.
func OneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Join is the items, each a string type (reasons, statuses), joined by sep:
// Join([]reencode.Reason{"version", "encryption"}, ",") is "version,encryption".
func Join[S ~string](items []S, sep string) string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = string(it)
	}
	return strings.Join(s, sep)
}

// Bytes prints a size in B, KiB, MiB, ... with one decimal: "512 B", "1.5 GiB".
func Bytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// BytesCompact is Bytes without the space, for table columns: "1.5GiB".
func BytesCompact(b int64) string { return strings.Replace(Bytes(b), " ", "", 1) }
