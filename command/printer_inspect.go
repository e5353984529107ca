package command

import (
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/reencode"
)

// writeInspected prints one inspected key as "json" ({"storage": ...,
// "object": ...}, no build stamp: it is the object, not a report) or "yaml"
// (the storage header and the rewrite as comments, then the object).
func writeInspected(w io.Writer, o *inventory.Inspected, format string) error {
	if format == "json" {
		return writeJSON(w, o)
	}
	var b strings.Builder
	h := o.Storage
	line := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "# %-15s %s\n", name+":", fmt.Sprintf(format, args...))
	}
	line("key", "%s", h.Key)
	if h.Resource != "" {
		line("resource", "%s", h.Resource)
	}
	line("revisions", "mod %d, create %d, version %d", h.ModRevision, h.CreateRevision, h.Version)
	switch {
	case h.Lease == "":
		line("lease", "none")
	case h.LeaseError != "":
		line("lease", "%s (TTL unknown: %s)", h.Lease, h.LeaseError)
	case h.LeaseTTL == nil:
		line("lease", "%s (granted %ds; a snapshot does not record the time left: restored, it starts again)", h.Lease, *h.LeaseGrantedTTL)
	case *h.LeaseTTL < 0:
		line("lease", "%s (expired)", h.Lease)
	default:
		line("lease", "%s (%ds left of %ds)", h.Lease, *h.LeaseTTL, *h.LeaseGrantedTTL)
	}
	if h.Provider != "" {
		enc := h.Provider
		if h.KeyName != "" {
			enc += ", key " + h.KeyName
		}
		if h.EncryptionStale {
			enc += " (stale: new writes use another provider or key)"
		}
		line("encryption", "%s", enc)
	}
	if h.MediaType != "" {
		line("media type", "%s", h.MediaType)
	}
	if h.APIVersion != "" {
		line("stored as", "%s %s", h.APIVersion, h.Kind)
	}
	line("size", "%d bytes", h.Size)
	if r := o.Rewrite; r != nil {
		switch r.Status {
		case reencode.Stale:
			line("migrate", "would rewrite it (%s) as %s %s, %s", textfmt.Join(r.Reasons, ", "), r.To.Version, r.To.MediaType, r.To.Encryption)
		case reencode.Current:
			line("migrate", "current: nothing to rewrite")
		default:
			line("migrate", "%s: %s", r.Status, r.Error)
		}
		for _, f := range r.FieldsDropped {
			line("drops field", "%s (in the schema of %s, pruned by %s's: kube-apiserver's next write drops it too; the journal keeps the original)", f, h.APIVersion, r.To.Version)
		}
		for _, e := range r.ManagedFieldsDropped {
			line("drops entry", "managedFields %s (the target kube-apiserver's field manager drops it on the next write: a version it does not serve, or more than ten update managers)", e)
		}
	}
	if o.Error != nil {
		line("error", "%s", o.Error.Reason)
		if o.Error.Orphan != "" {
			line("orphan", "%s", o.Error.Orphan)
		}
		if o.Error.Detail != "" {
			line("detail", "%s", o.Error.Detail)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	data, err := yaml.Marshal(o.Object)
	if err != nil {
		return fmt.Errorf("%s: render YAML: %w", h.Key, err)
	}
	b.WriteString("---\n")
	b.Write(data)
	_, err = io.WriteString(w, b.String())
	return err
}
