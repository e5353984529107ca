package restore

import (
	"fmt"
	"sort"
	"strings"
)

// SelectError is a selection the live cluster or the backup cannot serve:
// Option names the selector ("namespace", "resource", "name", "key").
// Nothing was written.
type SelectError struct {
	Option, Value, Msg string
}

func (e *SelectError) Error() string {
	return fmt.Sprintf("restore %s %s: %s", e.Option, e.Value, e.Msg)
}

// MissingKeysError is values of the backup under providers or keys the
// backup's encryption configuration does not have (Keys), or has but that
// refused them (Refused: other key material under the same name, a KMS
// plugin down). Nothing was written.
type MissingKeysError struct {
	Config string
	// Keys and Refused are provider[:key] → the first key of etcd under it.
	Keys, Refused map[string]string
}

func (e *MissingKeysError) Error() string {
	cfg := e.Config
	if cfg == "" {
		cfg = "the backup's encryption configuration"
	}
	var parts []string
	if len(e.Keys) > 0 {
		parts = append(parts, fmt.Sprintf("the backup's values need %s, which %s does not hold: give the encryption configuration the backup was written with", listKeys(e.Keys), cfg))
	}
	if len(e.Refused) > 0 {
		parts = append(parts, fmt.Sprintf("the backup's values under %s do not decrypt with %s (other key material under that name, or its KMS plugin refused): give the configuration the backup was written with, its plugins running", listKeys(e.Refused), cfg))
	}
	return strings.Join(parts, "; ") + "; nothing was written"
}

// listKeys is "provider:key (e.g. KEY), ..." in name order.
func listKeys(m map[string]string) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s (e.g. %s)", n, m[n])
	}
	return strings.Join(parts, ", ")
}

// MissingCRDError is custom resources of the backup whose CRD the live etcd
// lacks: today's CRD decides how they are stored. Nothing was written.
type MissingCRDError struct {
	// CRDs are the CRDs' names (plural.group) → whether the backup holds it.
	CRDs map[string]bool
}

func (e *MissingCRDError) Error() string {
	names := make([]string, 0, len(e.CRDs))
	for k := range e.CRDs {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		how := "create it first (kubectl apply of its definition)"
		if e.CRDs[n] {
			how = "restore it first (restore --resource customresourcedefinitions.apiextensions.k8s.io --name " + n + "), then run this restore again"
		}
		parts = append(parts, fmt.Sprintf("CRD %s is not in the live etcd: %s", n, how))
	}
	return strings.Join(parts, "; ") + "; nothing was written"
}

// DanglingOwnersError refuses a restore whose objects name owners absent
// from both the live etcd and the selection. Nothing was written.
type DanglingOwnersError struct{ N int64 }

func (e *DanglingOwnersError) Error() string {
	return fmt.Sprintf("%d object(s) name an owner that is neither in the live etcd nor in the selection (listed as dangling-owner): the garbage collector would delete them at once; add their owners to the selection, or allow them; nothing was written", e.N)
}
