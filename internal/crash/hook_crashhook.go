//go:build crashhook

package crash

import "os"

// HookEnv names the point At panics at, in a binary built with -tags
// crashhook: the tests' way to a real panic in the built tool.
const HookEnv = "KUBE_ETCD_MIGRATE_PANIC_AT"

// At dereferences a nil pointer when HookEnv names point.
func At(point string) {
	if os.Getenv(HookEnv) == point {
		var p *struct{ n int }
		_ = p.n
	}
}
