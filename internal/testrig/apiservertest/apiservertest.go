// Package apiservertest starts a real, in-process kube-apiserver (the one
// linked from k8s.io/kubernetes, cmd/kube-apiserver/app/testing) on top of an
// existing etcd, for the end-to-end tests and the capture of reference values.
//
// Several servers may be started one after another on the same etcd within a
// single test (for example an emulated 1.34 server, then a 1.37 one), as long
// as the previous one is stopped first: the kube-apiserver test server mutates
// process-wide feature gates, which Stop restores. For the same reason, tests
// that start servers with different emulated versions or feature gates must
// not run in parallel (t.Parallel) within one test binary: the upstream
// feature-gate helpers detect it and fail the test.
package apiservertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	flowcontrolbootstrap "k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

// Options configure one kube-apiserver instance.
type Options struct {
	// EtcdURL is the etcd client URL, e.g. testetcd.Server.URL. Required.
	EtcdURL string
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile are --etcd-cafile,
	// --etcd-certfile and --etcd-keyfile, for an etcd that serves TLS.
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// Prefix is --etcd-prefix; default "/registry".
	Prefix string
	// EmulatedVersion, e.g. "1.33", becomes --emulated-version=1.33 (which
	// also changes the storage versions). Empty: the binary version (1.37).
	EmulatedVersion string
	// FeatureGates is --feature-gates, e.g. "DynamicResourceAllocation=true".
	FeatureGates string
	// RuntimeConfig is --runtime-config, e.g. "resource.k8s.io/v1beta1=true".
	RuntimeConfig string
	// EncryptionConfigPath is --encryption-provider-config.
	EncryptionConfigPath string
	// KeepCompaction leaves the apiserver's etcd compactor on (every 5 min).
	// By default it is off (--etcd-compaction-interval=0) so tests can read
	// old revisions deterministically.
	KeepCompaction bool
	// ExtraFlags are appended last and so win over everything above.
	ExtraFlags []string
	// SkipHealthz returns as soon as the server serves, without waiting for
	// /healthz: for a server that is not expected to become healthy (an etcd
	// holding values no configured key decrypts).
	SkipHealthz bool
	// PriorityAndFairness leaves API Priority and Fairness on, as in a real
	// cluster: the server then creates and keeps up to date the bootstrap
	// FlowSchemas and PriorityLevelConfigurations (its post-start hook
	// priority-and-fairness-config-producer, which /healthz waits for) and
	// writes their status conditions. Start then also waits until every
	// bootstrap object exists and every FlowSchema carries the Dangling
	// condition of the P&F configuration controller, so that no write of
	// the server's own races the test's. By default P&F is off
	// (--enable-priority-and-fairness=false), which saves start-up time.
	PriorityAndFairness bool
}

// Server is a running kube-apiserver.
type Server struct {
	// ClientConfig is a loopback, privileged (system:masters) client config.
	ClientConfig *rest.Config
	// Prefix is the etcd prefix the server stores under, e.g. "/registry".
	Prefix string
	// Flags are the command-line flags the server was started with.
	Flags []string
	// StartupDuration is how long Start took until /healthz was ok and the
	// default namespace existed (with PriorityAndFairness, also until the
	// P&F bootstrap objects had settled).
	StartupDuration time.Duration

	tb       *scopedTB
	tearDown func()
	stopOnce sync.Once
}

// Start starts a kube-apiserver against opts.EtcdURL and waits until it is
// healthy. It fails the test on error. The server is stopped by Stop or, at
// the latest, when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.EtcdURL == "" {
		t.Fatalf("apiservertest: Options.EtcdURL is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "/registry"
	}
	flags := Flags(opts)

	storageConfig := storagebackend.NewDefaultConfig(opts.Prefix, nil)
	storageConfig.Transport.ServerList = []string{opts.EtcdURL}
	storageConfig.Transport.TrustedCAFile = opts.EtcdCAFile
	storageConfig.Transport.CertFile = opts.EtcdCertFile
	storageConfig.Transport.KeyFile = opts.EtcdKeyFile
	if !opts.KeepCompaction {
		storageConfig.CompactionInterval = 0
	}

	scoped := &scopedTB{TB: t}
	instance := kubeapiservertesting.NewDefaultTestServerOptions()
	// No client-certificate / front-proxy authentication: the tests use the
	// loopback token, and generating the CAs and keys costs start-up time.
	instance.EnableCertAuth = false
	instance.SkipHealthzCheck = opts.SkipHealthz

	begin := time.Now()
	result, err := kubeapiservertesting.StartTestServer(scoped, instance, flags, storageConfig)
	if err != nil {
		scoped.runCleanups()
		t.Fatalf("apiservertest: start kube-apiserver (flags %q): %v", flags, err)
	}
	s := &Server{
		ClientConfig: result.ClientConfig,
		Prefix:       opts.Prefix,
		Flags:        flags,
		tb:           scoped,
		tearDown:     result.TearDownFn,
	}
	t.Cleanup(s.Stop)
	if opts.PriorityAndFairness && !opts.SkipHealthz {
		if err := waitPriorityAndFairnessSettled(s.ClientConfig); err != nil {
			t.Fatalf("apiservertest: %v", err)
		}
	}
	s.StartupDuration = time.Since(begin)
	t.Logf("apiservertest: kube-apiserver ready in %s with flags %q", s.StartupDuration.Round(time.Millisecond), flags)
	return s
}

// waitPriorityAndFairnessSettled waits until every bootstrap FlowSchema and
// PriorityLevelConfiguration kube-apiserver ensures (the lists in
// k8s.io/apiserver's flowcontrol bootstrap package) exists, and the P&F
// configuration controller has written the Dangling condition of every
// FlowSchema (it does so through server-side apply of the status, once
// after start and then only when the condition changes).
func waitPriorityAndFairnessSettled(cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var missing []string
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		missing = missing[:0]
		fss, err := cs.FlowcontrolV1().FlowSchemas().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		plcs, err := cs.FlowcontrolV1().PriorityLevelConfigurations().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		haveFS := map[string]bool{}
		for _, fs := range fss.Items {
			haveFS[fs.Name] = true
			if !hasCondition(fs.Status.Conditions, flowcontrolv1.FlowSchemaConditionDangling) {
				missing = append(missing, "flowschemas/"+fs.Name+" condition Dangling")
			}
		}
		havePLC := map[string]bool{}
		for _, plc := range plcs.Items {
			havePLC[plc.Name] = true
		}
		for _, fs := range slices.Concat(flowcontrolbootstrap.MandatoryFlowSchemas, flowcontrolbootstrap.SuggestedFlowSchemas) {
			if !haveFS[fs.Name] {
				missing = append(missing, "flowschemas/"+fs.Name)
			}
		}
		for _, plc := range slices.Concat(flowcontrolbootstrap.MandatoryPriorityLevelConfigurations, flowcontrolbootstrap.SuggestedPriorityLevelConfigurations) {
			if !havePLC[plc.Name] {
				missing = append(missing, "prioritylevelconfigurations/"+plc.Name)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("API Priority and Fairness bootstrap objects not settled (missing %v): %w", missing, err)
	}
	return nil
}

func hasCondition(conds []flowcontrolv1.FlowSchemaCondition, t flowcontrolv1.FlowSchemaConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return true
		}
	}
	return false
}

// Flags returns the kube-apiserver flags Start derives from opts.
func Flags(opts Options) []string {
	var flags []string
	if opts.Prefix != "" {
		flags = append(flags, "--etcd-prefix="+opts.Prefix)
	}
	if opts.EmulatedVersion != "" {
		flags = append(flags, "--emulated-version="+opts.EmulatedVersion)
	}
	if opts.FeatureGates != "" {
		flags = append(flags, "--feature-gates="+opts.FeatureGates)
	}
	if opts.RuntimeConfig != "" {
		flags = append(flags, "--runtime-config="+opts.RuntimeConfig)
	}
	if opts.EncryptionConfigPath != "" {
		flags = append(flags, "--encryption-provider-config="+opts.EncryptionConfigPath)
	}
	if !opts.PriorityAndFairness {
		// Priority and fairness runs its own config controllers and
		// bootstraps objects; most tests do not need them.
		flags = append(flags, "--enable-priority-and-fairness=false")
	}
	flags = append(flags,
		// The tests create objects directly; no default ServiceAccount,
		// no namespace lifecycle waits on informers.
		"--disable-admission-plugins=ServiceAccount",
	)
	return append(flags, opts.ExtraFlags...)
}

// Stop stops the server, waits for it to shut down and restores the
// process-wide feature gates it changed. Safe to call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.tearDown != nil {
			s.tearDown()
		}
		s.tb.runCleanups()
	})
}

// scopedTB is the testing.TB handed to the kube-apiserver test server. It
// collects the Cleanup callbacks (server context cancel, feature-gate and
// emulation-version restores) so that Stop can run them when this server
// stops rather than when the whole test ends; otherwise a second server in
// the same test would inherit the first one's emulated version and gates.
type scopedTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func (s *scopedTB) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *scopedTB) runCleanups() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			return
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		f()
	}
}
