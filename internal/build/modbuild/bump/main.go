// Command bump moves this module to another Kubernetes release: k8s.io/kubernetes
// at vX.Y.Z and every staging module its go.mod points at ./staging replaced by
// v0.Y.Z (the one replace block in go.mod), then go mod tidy. Run from the
// module root: `make bump-kubernetes KUBERNETES=v1.38.0`. docs/releasing.md says
// what comes after.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"

	"kube-etcd-migrate/internal/build/modbuild"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: bump vX.Y.Z")
		os.Exit(2)
	}
	version := os.Args[1]
	spec, err := modbuild.KubeAPIServer(context.Background(), version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bump:", err)
		os.Exit(1)
	}
	mods := make([]string, 0, len(spec.Replace))
	for m := range spec.Replace {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	args := []string{"mod", "edit"}
	for _, m := range mods {
		args = append(args, "-replace", m+"="+m+"@"+spec.Replace[m])
	}
	steps := [][]string{args, {"get", "k8s.io/kubernetes@" + version}, {"mod", "tidy"}}
	for _, step := range steps {
		cmd := exec.Command("go", step...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "bump: go %v: %v\n", step[:2], err)
			os.Exit(1)
		}
	}
	fmt.Printf("k8s.io/kubernetes %s, %d staging modules at %s\n", version, len(mods), spec.Replace[mods[0]])
}
