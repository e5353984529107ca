package command

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/quarantine"
	"kube-etcd-migrate/target"
)

// TestQuarantineDryRunTable: a dry run's table says what would be removed
// of how many unreadable objects, and never prints a secret value.
func TestQuarantineDryRunTable(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	key1 := c.EncryptionConfig("key1.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	key2 := c.EncryptionConfig("key2.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	otherKey2 := c.EncryptionConfig("other-key2.yaml", testcluster.AESCBC("key2", 3), testcluster.Identity)
	for i := 0; i < 4; i++ {
		// Lost (key1 is gone from the configuration), and readable.
		c.Put(fmt.Sprintf("/registry/secrets/app/old-%d", i), testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("old-%d", i), "pw"), "", "", key1)
		c.Put(fmt.Sprintf("/registry/secrets/app/new-%d", i), testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("new-%d", i), "pw"), "", "", key2)
	}
	for i := 0; i < 3; i++ {
		// Refused by a configured key: kept.
		c.Put(fmt.Sprintf("/registry/secrets/app/wrong-material-%d", i), testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("wrong-material-%d", i), "pw"), "", "", otherKey2)
	}
	c.PutRaw("/registry/secrets/app/no-key-name", []byte("k8s:enc:aescbc:v1:"))
	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: key2}, Resources: []string{"secrets"}})
	res, err := quarantine.Run(context.Background(), env, quarantine.Options{Reasons: []decode.Reason{decode.ReasonUndecryptable}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := printReport(&b, "table", quarantineReport{res}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "dry run: would remove 4 of 8 unreadable object(s)") || strings.Contains(b.String(), "pw") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestQuarantineSummaryNamesTheWayBack: the summary line of removals says
// where their values are: the journal to roll back, or, for an
// --output-snapshot written without one, the input snapshot.
func TestQuarantineSummaryNamesTheWayBack(t *testing.T) {
	for _, tc := range []struct {
		journal, want, not string
	}{
		{"/var/lib/q.journal", "their values are in the journal /var/lib/q.journal ('rollback --journal /var/lib/q.journal' puts them back)", "input snapshot"},
		{"", "the input snapshot, never modified, still holds them", "journal"},
	} {
		var b bytes.Buffer
		res := &quarantine.Result{Journal: tc.journal, Removed: 2, Unreadable: 2, Reasons: []decode.Reason{decode.ReasonUndecryptable}, Entries: []quarantine.Entry{}}
		if err := printReport(&b, "table", quarantineReport{res}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) || strings.Contains(b.String(), tc.not) {
			t.Errorf("journal %q: table:\n%s", tc.journal, b.String())
		}
	}
}
