package command

import (
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestSetupUsageExitCodes: a flag value only the pipeline's setup can judge
// (a --resource etcd's CRDs and the scheme do not have, a storage media type
// kube-apiserver does not store in) is a usage error, exit 2, with one line
// naming the flag; another failure of the setup (a --prefix etcd has no keys
// under) is exit 1, even though its line names a flag too.
func TestSetupUsageExitCodes(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put("/registry/configmaps/ns1/app", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "app"), "", "", "")
	ep := c.Srv.Endpoint
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"verify", "--resource", "nosuchthings"}, exitUsage, `error: --resource "nosuchthings": no built-in resource or CRD of that name (use resource.group, e.g. deployments.apps)`},
		{[]string{"inventory", "--resource", "nosuchthings.example.com"}, exitUsage, `error: --resource "nosuchthings.example.com": no built-in resource or CRD of that name`},
		{[]string{"verify", "--storage-media-type", "application/xml"}, exitUsage, `error: --storage-media-type "application/xml": want one of application/vnd.kubernetes.protobuf, application/json, application/yaml`},
		{[]string{"verify", "--prefix", "/elsewhere"}, exitError, `error: --prefix /elsewhere: etcd has no keys under it`},
	} {
		code, _, stderr := runCLI(t, append(tc.args, "--endpoints", ep)...)
		last := stderr
		if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		if code != tc.code || !strings.HasPrefix(last, tc.want) {
			t.Errorf("%v: exit %d, last line %q; want exit %d and %q", tc.args, code, last, tc.code, tc.want)
		}
	}
}
