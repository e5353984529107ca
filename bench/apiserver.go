package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"

	"kube-etcd-migrate/internal/testrig/apiservertest"
)

// The incumbent: what kube-storage-version-migrator (and `kubectl get | kubectl
// replace` loops) do: list each resource in pages of 500 through kube-apiserver and
// PUT every object back unchanged, 10 workers per page, no client-side rate limit.
const (
	apiListPage = 500
	apiWorkers  = 10
)

var apiResources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "namespaces"},
	{Version: "v1", Resource: "secrets"},
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "pods"},
	{Version: "v1", Resource: "events"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "resource.k8s.io", Version: "v1", Resource: "deviceclasses"},
	{Group: crGroup, Version: "v1", Resource: "widgets"},
}

// benchTB is the testing.TB-like value kube-apiserver's test server wants
// (ktesting.TB): this is a program, not a test.
type benchTB struct {
	mu       sync.Mutex
	cleanups []func()
	failed   bool
	dirs     []string
}

func (b *benchTB) Attr(string, string) {}
func (b *benchTB) Chdir(dir string)    { _ = os.Chdir(dir) }
func (b *benchTB) Cleanup(f func())    { b.mu.Lock(); b.cleanups = append(b.cleanups, f); b.mu.Unlock() }
func (b *benchTB) Error(args ...any) {
	b.failed = true
	logf("kube-apiserver: %s", fmt.Sprint(args...))
}
func (b *benchTB) Errorf(f string, a ...any) { b.failed = true; logf("kube-apiserver: "+f, a...) }
func (b *benchTB) Fail()                     { b.failed = true }
func (b *benchTB) FailNow()                  { b.failed = true; panic("kube-apiserver test server: FailNow") }
func (b *benchTB) Failed() bool              { return b.failed }
func (b *benchTB) Fatal(args ...any)         { b.Error(args...); b.FailNow() }
func (b *benchTB) Fatalf(f string, a ...any) { b.Errorf(f, a...); b.FailNow() }
func (b *benchTB) Helper()                   {}
func (b *benchTB) Log(...any)                {}
func (b *benchTB) Logf(string, ...any)       {}
func (b *benchTB) Name() string              { return "bench" }
func (b *benchTB) Setenv(k, v string)        { _ = os.Setenv(k, v) }
func (b *benchTB) Skip(...any)               {}
func (b *benchTB) Skipf(string, ...any)      {}
func (b *benchTB) SkipNow()                  {}
func (b *benchTB) Skipped() bool             { return false }
func (b *benchTB) TempDir() string {
	d, err := os.MkdirTemp("", "kem-bench-apiserver-")
	if err != nil {
		panic(err)
	}
	b.mu.Lock()
	b.dirs = append(b.dirs, d)
	b.mu.Unlock()
	return d
}

func (b *benchTB) runCleanups() {
	for {
		b.mu.Lock()
		n := len(b.cleanups)
		if n == 0 {
			b.mu.Unlock()
			break
		}
		f := b.cleanups[n-1]
		b.cleanups = b.cleanups[:n-1]
		b.mu.Unlock()
		f()
	}
	for _, d := range b.dirs {
		os.RemoveAll(d)
	}
}

// startAPIServer starts the linked kube-apiserver in-process with the flags the
// project's apiservertest harness uses.
func startAPIServer(etcdURL, encCfg string) (*rest.Config, func(), error) {
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	opts := apiservertest.Options{EtcdURL: etcdURL, Prefix: "/registry", EncryptionConfigPath: encCfg}
	storageConfig := storagebackend.NewDefaultConfig(opts.Prefix, nil)
	storageConfig.Transport.ServerList = []string{etcdURL}
	storageConfig.CompactionInterval = 0
	instance := kubeapiservertesting.NewDefaultTestServerOptions()
	instance.EnableCertAuth = false
	tb := &benchTB{}
	result, err := kubeapiservertesting.StartTestServer(tb, instance, apiservertest.Flags(opts), storageConfig)
	if err != nil {
		tb.runCleanups()
		return nil, nil, fmt.Errorf("start kube-apiserver: %w", err)
	}
	stop := func() {
		result.TearDownFn()
		tb.runCleanups()
	}
	return result.ClientConfig, stop, nil
}

// apiserverRuns measures the incumbent on the same kind of keyspace.
func apiserverRuns(ctx context.Context, o options, res *results, gen *generator, etcd *etcdProc, newCfg string, settle func() error) error {
	n := o.apiserverN
	if n <= 0 || n > o.n {
		n = o.n
	}
	res.APIServerN = n
	all := func(objSpec) bool { return true }
	g := *gen
	if n != o.n {
		// A smaller keyspace of the same mix: start over.
		if _, err := etcd.cli.Delete(ctx, "/registry/", clientV3Prefix()...); err != nil {
			return err
		}
		g.n = n
		res.Notes = append(res.Notes, fmt.Sprintf("the apiserver path ran on N=%d (the tool on N=%d); the ratio compares objects/s", n, o.n))
	}
	if _, err := g.seed(ctx, etcd.cli, all, true); err != nil {
		return err
	}
	logf("starting kube-apiserver (in-process) on the benchmark etcd")
	cfg, stop, err := startAPIServer(etcd.URL, newCfg)
	if err != nil {
		return err
	}
	defer stop()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = -1 // no client-side rate limit
	cfg.Burst = 0
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The CRD is read from etcd; wait until its custom resources are served.
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := dyn.Resource(apiResources[len(apiResources)-1]).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("widgets never served by kube-apiserver: %w", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for rep := 1; rep <= o.reps; rep++ {
		if rep > 1 {
			// Back to the seeded bytes (the previous PUTs rewrote every object).
			if _, err := g.seed(ctx, etcd.cli, all, false); err != nil {
				return err
			}
		}
		if err := settle(); err != nil {
			return err
		}
		before := etcd.RSSKB()
		start := time.Now()
		objs, failed, firstErr := noopPuts(ctx, dyn)
		el := time.Since(start)
		if failed > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("apiserver rep %d: %d of %d PUTs failed, first: %v", rep, failed, objs, firstErr))
		}
		res.get(mAPI).Samples = append(res.get(mAPI).Samples, sample{Seconds: el.Seconds(), Objects: objs, Rewrites: objs - failed, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB()})
		logf("  apiserver %d/%d: %d objects PUT in %.1fs (%.0f/s), %d failed", rep, o.reps, objs, el.Seconds(), float64(objs)/el.Seconds(), failed)
	}
	return nil
}

// noopPuts lists every resource in pages and PUTs each object back unchanged.
func noopPuts(ctx context.Context, dyn dynamic.Interface) (objs, failed int64, firstErr error) {
	var nFailed atomic.Int64
	var errOnce sync.Once
	for _, gvr := range apiResources {
		cont := ""
		for {
			list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: apiListPage, Continue: cont})
			if err != nil {
				return objs, nFailed.Load(), fmt.Errorf("list %s: %w", gvr, err)
			}
			items := make(chan *unstructured.Unstructured)
			var wg sync.WaitGroup
			for w := 0; w < apiWorkers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for it := range items {
						_, err := dyn.Resource(gvr).Namespace(it.GetNamespace()).Update(ctx, it, metav1.UpdateOptions{})
						if err != nil {
							nFailed.Add(1)
							errOnce.Do(func() { firstErr = fmt.Errorf("PUT %s %s/%s: %w", gvr.Resource, it.GetNamespace(), it.GetName(), err) })
						}
					}
				}()
			}
			for i := range list.Items {
				items <- &list.Items[i]
			}
			close(items)
			wg.Wait()
			objs += int64(len(list.Items))
			cont = list.GetContinue()
			if cont == "" {
				break
			}
		}
	}
	return objs, nFailed.Load(), firstErr
}
