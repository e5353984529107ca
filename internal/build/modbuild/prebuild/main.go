// Command prebuild builds the other releases' binaries the tests use (package
// modbuild) into their cache, so that `make test` builds each once, before
// the test binaries run in parallel.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"kube-etcd-migrate/internal/build/modbuild"
)

func main() {
	ctx := context.Background()
	specs, err := modbuild.Releases(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "prebuild:", err)
		os.Exit(1)
	}
	for _, s := range specs {
		start := time.Now()
		bin, err := modbuild.Build(ctx, s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "prebuild:", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s (%s)\n", s.Name, bin, time.Since(start).Round(time.Second))
	}
}
