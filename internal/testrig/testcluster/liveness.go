package testcluster

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/apis/coordination"
)

// LeasesGR is coordination.k8s.io leases.
var LeasesGR = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// IdentityLease is a kube-apiserver identity lease as kube-apiserver stores it,
// renewed at renew by its node's clock.
func (c *Cluster) IdentityLease(name, host string, renew time.Time) []byte {
	holder := name + "_1"
	dur := int32(3600)
	rt := metav1.NewMicroTime(renew)
	labels := map[string]string{"apiserver.kubernetes.io/identity": "kube-apiserver"}
	if host != "" {
		labels["kubernetes.io/hostname"] = host
	}
	return c.Encode("/registry/leases/kube-system/"+name, LeasesGR, &coordination.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID("u-" + name), CreationTimestamp: metav1.Unix(1700000000, 0), Labels: labels},
		Spec:       coordination.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &rt, RenewTime: &rt},
	}, "", "", "")
}

// Renewer plays a live kube-apiserver whose node clock is skew off: it
// rewrites its identity lease every 150 ms with renewTime = its clock, until
// stopped.
func (c *Cluster) Renewer(t *testing.T, name, host string, skew time.Duration) (stop func()) {
	// Encoded here, on the test's goroutine (Encode fails the test).
	start := time.Now().Add(skew)
	var values [][]byte
	for i := range 100 {
		values = append(values, c.IdentityLease(name, host, start.Add(time.Duration(i)*150*time.Millisecond)))
	}
	return c.KeepWriting(t, "/registry/leases/kube-system/"+name, values)
}

// KeepWriting puts values[0] under key, then the next value every 150 ms
// (round the list) until stopped.
func (c *Cluster) KeepWriting(t *testing.T, key string, values [][]byte) (stop func()) {
	c.PutRaw(key, values[0])
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := c.Cli.Put(ctx, key, string(values[i%len(values)])); err != nil && ctx.Err() == nil {
				t.Errorf("write %s: %v", key, err)
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}
