package migrate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/apis/coordination"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/undo"
)

// testWindow is the liveness window of tests: a "kube-apiserver" in them
// renews every 150 ms.
const testWindow = 600 * time.Millisecond

// dump is every key under /registry with its value and mod revision.
func dump(t *testing.T, c *testcluster.Cluster) map[string]string {
	t.Helper()
	resp, err := c.Cli.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = fmt.Sprintf("%q@%d", kv.Value, kv.ModRevision)
	}
	return out
}

// sameExcept fails unless every key of before, but those in except, is in
// etcd byte for byte at the same mod revision, and no key was added.
func sameExcept(t *testing.T, c *testcluster.Cluster, before map[string]string, except ...string) {
	t.Helper()
	after := dump(t, c)
	skip := map[string]bool{}
	for _, k := range except {
		skip[k] = true
	}
	for k, v := range before {
		if !skip[k] && !bytes.Equal([]byte(after[k]), []byte(v)) {
			t.Errorf("%s was written", k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok && !skip[k] {
			t.Errorf("%s was created", k)
		}
	}
}

// TestLiveAPIServerWithSlowClock: a kube-apiserver renewing its identity lease
// every 150 ms, whose node's clock is 10 minutes behind (renewTime reads 10
// minutes old), is alive: the run is refused, nothing written, and the refusal
// names its key, its node and the revisions it moved by. A second node's
// stopped apiserver, whose lease reads 10 minutes in the future, is not named.
func TestLiveAPIServerWithSlowClock(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.PutRaw("/registry/leases/kube-system/apiserver-stopped", c.IdentityLease("apiserver-stopped", "cp-2", time.Now().Add(10*time.Minute)))
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	live := "/registry/leases/kube-system/apiserver-abc"
	stop := c.Renewer(t, "apiserver-abc", "cp-1", -10*time.Minute)
	before := dump(t, c)

	_, err := Run(context.Background(), c.Env(pipeline.Config{}), Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: undo.DefaultQuotaBackendBytes}})
	stop()
	var pe *undo.PreflightError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a preflight refusal", err)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"a kube-apiserver is alive", "cp-1: " + live + " written", "mod revision", "not used", string(input.AllowLiveAPIServer), "nothing was written"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "apiserver-stopped") {
		t.Errorf("refusal names the stopped apiserver's lease: %s", msg)
	}
	sameExcept(t, c, before, live)
}

// TestStoppedAPIServerWithFastClock: a lease nobody renews whose renewTime
// is 10 minutes ahead of this clock (its node's clock is fast) does not block
// the run, nor one 10 minutes behind.
func TestStoppedAPIServerWithFastClock(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.PutRaw("/registry/leases/kube-system/apiserver-future", c.IdentityLease("apiserver-future", "cp-1", time.Now().Add(10*time.Minute)))
	c.PutRaw("/registry/leases/kube-system/apiserver-past", c.IdentityLease("apiserver-past", "cp-2", time.Now().Add(-10*time.Minute)))
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	sum, err := Run(context.Background(), c.Env(pipeline.Config{}), Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: undo.DefaultQuotaBackendBytes}})
	if err != nil || sum.Summary.Rewritten != 1 {
		t.Fatalf("err %v summary %+v", err, sum.Summary)
	}
	if !strings.Contains(strings.Join(sum.Preflight, "\n"), "no key under /registry written while watched for 600ms") {
		t.Errorf("preflight %q does not say what it watched", sum.Preflight)
	}
}

// TestOtherWritersAndMasterLeases: with no kube-apiserver lease moving, a
// kube-controller-manager leader lease renewed during the window (only a
// kube-apiserver writes there) refuses the run and is named; a master lease
// whose etcd lease has time left refuses it with "wait and rerun"; keys etcd
// deletes with their lease meanwhile (an Event's, a stopped kube-apiserver's
// master lease) do not.
func TestOtherWritersAndMasterLeases(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	ctx := context.Background()
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	evLease, err := c.Cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	c.Put("/registry/events/default/e1", schema.GroupResource{Resource: "events"}, testcluster.Event("default", "e1"), "", "", "", clientv3.WithLease(evLease.ID))
	kcm := "/registry/leases/kube-system/kube-controller-manager"
	holder := "cp-1_x"
	value := c.Encode(kcm, testcluster.LeasesGR, &coordination.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: "kube-system", UID: "u", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       coordination.LeaseSpec{HolderIdentity: &holder},
	}, "", "", "")
	env := c.Env(pipeline.Config{})
	stop := c.KeepWriting(t, kcm, [][]byte{value})
	before := dump(t, c)
	_, err = Run(ctx, env, Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: undo.DefaultQuotaBackendBytes}})
	stop()
	if err == nil || !strings.Contains(err.Error(), "something is writing under /registry") || !strings.Contains(err.Error(), kcm+" written") {
		t.Fatalf("err = %v, want the kube-controller-manager lease named", err)
	}
	sameExcept(t, c, before, kcm)

	// A master lease kept by an etcd lease of 60 s: not written, but held.
	held, err := c.Cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ep := &api.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.1", UID: "m", CreationTimestamp: metav1.Unix(1700000000, 0)}}
	c.Put("/registry/masterleases/10.0.0.1", schema.GroupResource{Resource: "endpoints"}, ep, "", "", "", clientv3.WithLease(held.ID))
	before = dump(t, c)
	_, err = Run(ctx, env, Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: undo.DefaultQuotaBackendBytes}})
	if err == nil || !strings.Contains(err.Error(), "/registry/masterleases/10.0.0.1 has") || !strings.Contains(err.Error(), "wait that long and rerun") {
		t.Fatalf("err = %v, want the held master lease named", err)
	}
	sameExcept(t, c, before)

	// Both leases end during the window (as etcd expires them): the run proceeds.
	done := make(chan error, 1)
	go func() {
		time.Sleep(400 * time.Millisecond)
		_, err := c.Cli.Revoke(ctx, held.ID)
		if err == nil {
			_, err = c.Cli.Revoke(ctx, evLease.ID)
		}
		done <- err
	}()
	sum, err := Run(ctx, env, Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: time.Second, QuotaBackendBytes: undo.DefaultQuotaBackendBytes}})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil || sum.Summary.Rewritten != 1 {
		t.Fatalf("err %v summary %+v", err, sum.Summary)
	}
	if p := strings.Join(sum.Preflight, "\n"); !strings.Contains(p, "2 key(s) expired with their etcd lease meanwhile") {
		t.Errorf("preflight %q does not count the expired keys", p)
	}
}
