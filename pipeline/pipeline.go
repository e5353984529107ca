// Package pipeline is the read half shared by inventory, verify and migrate: it
// builds the apiserver's view of the cluster (storage codecs for the decode and the
// target release, encryption transformers, the CRDs found in etcd), then streams the
// keyspace at one revision through decode and the rewrite decision with bounded
// concurrency and bounded memory.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/target"
)

// Config is what every command shares.
type Config struct {
	Prefix    string   // etcd prefix, "/registry"
	Resources []string // --resource filters
	// Exclude are resources this etcd does not hold for kube-apiserver
	// (another etcd holds them: --etcd-servers-overrides): their keys are
	// not read, whatever is there.
	Exclude   []string
	Namespace string // --namespace filter
	PageSize  int64
	// Target is which kube-apiserver the run writes as, resolved once by
	// Setup (target.Resolve) before any CRD is loaded or KMS plugin probed.
	Target target.Input
	// Concurrency is the number of decode/decide workers; 0 = twice GOMAXPROCS
	// (measured: 13 % faster than one per CPU, the workers of a page finish
	// unevenly and etcd's own threads share the CPUs).
	Concurrency int
	// WebhookURLs maps "namespace/service" of CRD conversion webhooks to URLs
	// reachable from here (--conversion-webhook).
	WebhookURLs map[string]string
	// WebhookHint, given "namespace/service", says how to give an address
	// for a conversion webhook's Service (the flag); it ends the error when
	// neither WebhookURLs nor the Service's ready endpoints in etcd reach it.
	WebhookHint func(service string) string
	// CustomResources builds the codec of one CRD's custom resources; nil uses the
	// customresource package (the apiextensions-apiserver's read and write path).
	CustomResources CustomResourceFactory
	// Revision, when set (--revision), is the revision read-only runs read at,
	// CRDs included; it must not be compacted. 0 is the current revision.
	Revision int64
	// SnapshotFile names the snapshot file the etcd is a private copy of
	// (--snapshot-file), for reports; "" for a live etcd.
	SnapshotFile string
}

// CustomResourceCodec reads and writes one CRD's custom resources.
type CustomResourceCodec interface {
	decode.CustomResourceDecoder
	reencode.CustomResourceEncoder
}

// CustomResourceFactory makes the codec for a CRD.
type CustomResourceFactory func(crd *apiextensionsv1.CustomResourceDefinition) (CustomResourceCodec, error)

// CRD is a CustomResourceDefinition found in etcd.
type CRD struct {
	Key            string
	ModRevision    int64
	Resource       schema.GroupResource
	StorageVersion string
	StoredVersions []string
	Object         *apiextensionsv1.CustomResourceDefinition
	// Codec reads and writes its custom resources (nil when Err is set or no
	// CustomResourceFactory was configured).
	Codec CustomResourceCodec
	// Err is set when the CRD's custom resources cannot be read (its codec failed).
	Err error
}

// Env is a prepared run.
type Env struct {
	// Source is what every read goes through: the etcd client's, or a
	// snapshot file read in place (SetupSource).
	Source etcdscan.Source
	// Client writes (migrate, quarantine, rollback, storage migrations); nil
	// for a read-only run set up on a Source.
	Client  *clientv3.Client
	Config  Config
	Storage *decode.StorageConfig // decoding (the linked kube-apiserver)
	// Target is the kube-apiserver the run writes as (its storage
	// configuration encodes); Encryption is its encryption configuration.
	Target     *target.Target
	Encryption *encryption.Transformers
	Resolver   *decode.Resolver
	Decoder    *decode.Decoder
	Planner    *reencode.Planner
	CRDs       []*CRD
	// Prefixes are the key ranges the run scans, in key order.
	Prefixes []string
	// Filter, when set, limits the run to these resources.
	Filter map[schema.GroupResource]bool
	// Skip are the key prefixes of Config.Exclude: Run leaves their keys out.
	Skip []string
	// Warnings are one line each for the operator (stderr), found by Setup:
	// a KMS plugin the selected resources read with that does not work.
	Warnings []string

	// narrowed is set on an Env made by Narrow: it shares e's target.
	narrowed bool
}

// Setup prepares a run on an etcd client, which reads and writes: storage
// codecs, encryption, CRDs (read from etcd at the current revision), and the
// key ranges the filters select.
func Setup(ctx context.Context, cli *clientv3.Client, cfg Config) (*Env, error) {
	env, err := SetupSource(ctx, etcdscan.ClientSource{Client: cli}, cfg)
	if err != nil {
		return nil, err
	}
	env.Client = cli
	return env, nil
}

// SetupSource prepares a read-only run (inventory, inspect, verify,
// quarantine --dry-run) that reads src: Env.Client is nil.
func SetupSource(ctx context.Context, src etcdscan.Source, cfg Config) (*Env, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "/registry"
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = etcdscan.DefaultPageSize
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2 * runtime.GOMAXPROCS(0)
	}
	if err := checkPrefix(ctx, src, cfg.Prefix); err != nil {
		return nil, err
	}
	if err := checkRevision(ctx, src, cfg.Revision); err != nil {
		return nil, err
	}
	if cfg.Target.Prefix == "" {
		cfg.Target.Prefix = cfg.Prefix
	}
	tgt, err := target.Resolve(ctx, src, cfg.Target)
	if err != nil {
		return nil, err
	}
	env, err := setupFor(ctx, src, cfg, tgt)
	if err != nil {
		tgt.Close()
		return nil, err
	}
	return env, nil
}

// setupFor is SetupSource once the target is resolved.
func setupFor(ctx context.Context, src etcdscan.Source, cfg Config, tgt *target.Target) (*Env, error) {
	storage, err := decode.NewStorageConfig("")
	if err != nil {
		return nil, err
	}
	enc := tgt.Encryption()
	endpoints := &webhookEndpoints{}
	if cfg.CustomResources == nil {
		cfg.CustomResources = defaultCustomResources(cfg.WebhookURLs, cfg.WebhookHint, endpoints, tgt.Update(), tgt.FullFieldManager())
	}
	res := decode.NewResolver(cfg.Prefix, storage)
	env := &Env{
		Source:     src,
		Config:     cfg,
		Storage:    storage,
		Target:     tgt,
		Encryption: enc,
		Resolver:   res,
		Decoder:    decode.NewDecoder(res, storage, enc),
		Planner:    reencode.NewPlanner(tgt.Storage(), enc),
	}
	env.Planner.Update = tgt.Update()
	env.Planner.EncryptionOnly = tgt.EncryptionOnly()
	env.Decoder.KeepVersioned = env.Planner.Converts
	if err := env.loadCRDs(ctx, endpoints); err != nil {
		return nil, err
	}
	if err := env.loadAggregatedGroups(ctx); err != nil {
		return nil, err
	}
	if err := env.selectPrefixes(); err != nil {
		return nil, err
	}
	env.checkKMSPlugins(ctx)
	return env, nil
}

// checkKMSPlugins asks the KMS plugins of the selected resources whether they
// work (decode.CheckKMSPlugins) and makes a warning of each that does not: a
// plugin that is down makes only what it encrypted unreadable, other providers
// still read the rest, and each of those objects is reported undecryptable
// (verify's exit code says so), so the run goes on; the warning says, once,
// which plugin at which endpoint is at fault.
func (e *Env) checkKMSPlugins(ctx context.Context) {
	var grs []schema.GroupResource
	if e.Filter != nil {
		grs = make([]schema.GroupResource, 0, len(e.Filter))
		for gr := range e.Filter {
			grs = append(grs, gr)
		}
		sort.Slice(grs, func(i, j int) bool { return grs[i].String() < grs[j].String() })
	}
	for _, err := range e.Encryption.CheckKMSPlugins(ctx, grs) {
		e.Warnings = append(e.Warnings, err.ReadWarning())
	}
}

// Close releases the encryption providers (KMS connections).
func (e *Env) Close() {
	if !e.narrowed {
		e.Target.Close()
	}
}

// errFound stops firstKey's scan.
var errFound = errors.New("found")

// loadAggregatedGroups reads the APIServices and records the groups sent to
// an aggregated API server (a Service): keys laid out under such a group are
// that server's, not a deleted CRD's leftovers. An APIService that does not
// decode is reported by the scan like any unreadable object.
func (e *Env) loadAggregatedGroups(ctx context.Context) error {
	prefix, err := e.Resolver.KeyPrefix(decode.APIServiceGroupResource, "")
	if err != nil {
		return nil // this release stores no APIServices
	}
	opts := etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: e.Config.PageSize, Revision: e.Config.Revision, KeepRevision: e.Config.Revision > 0}
	_, err = e.Source.Scan(ctx, opts, func(page []etcdscan.KV) error {
		for _, kv := range page {
			obj, err := e.Decoder.Decode(ctx, kv)
			if err != nil {
				continue
			}
			if svc, ok := obj.Internal.(*apiregistration.APIService); ok && svc.Spec.Service != nil && svc.Spec.Group != "" {
				e.Resolver.AddAggregatedGroup(svc.Spec.Group, fmt.Sprintf("APIService %s, service %s/%s", svc.Name, svc.Spec.Service.Namespace, svc.Spec.Service.Name))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the APIServices (%s): %w", prefix, err)
	}
	return nil
}

// loadCRDs reads every CRD object and registers its custom resources. The
// Services of their conversion webhooks are read first, into endpoints, which
// the default codecs resolve them through.
func (e *Env) loadCRDs(ctx context.Context, endpoints *webhookEndpoints) error {
	opts := etcdscan.ScanOptions{Prefixes: []string{e.Resolver.CRDKeyPrefix()}, PageSize: e.Config.PageSize, Revision: e.Config.Revision, KeepRevision: e.Config.Revision > 0}
	var crds []*CRD
	_, err := e.Source.Scan(ctx, opts, func(page []etcdscan.KV) error {
		for _, kv := range page {
			obj, err := e.Decoder.Decode(ctx, kv)
			internal, ok := obj.Internal.(*apiextensions.CustomResourceDefinition)
			if err != nil || !ok {
				// Reported by the scan like any unreadable object. Its
				// custom resources are not orphaned: the CRD is in etcd, and
				// its name is <plural>.<group> (apiextensions validates it).
				if plural, group, found := strings.Cut(path.Base(kv.Key), "."); found {
					e.Resolver.AddCustomResource(group, plural)
				}
				continue
			}
			v1 := &apiextensionsv1.CustomResourceDefinition{}
			if err := decode.ExtensionsScheme.Convert(internal, v1, nil); err != nil {
				return fmt.Errorf("%s: convert CRD to apiextensions.k8s.io/v1: %w", kv.Key, err)
			}
			crd := &CRD{
				Key:            kv.Key,
				ModRevision:    kv.ModRevision,
				Resource:       schema.GroupResource{Group: v1.Spec.Group, Resource: v1.Spec.Names.Plural},
				StoredVersions: append([]string(nil), v1.Status.StoredVersions...),
				Object:         v1,
			}
			for _, v := range v1.Spec.Versions {
				if v.Storage {
					crd.StorageVersion = v.Name
				}
			}
			e.Resolver.AddCustomResource(crd.Resource.Group, crd.Resource.Resource)
			crds = append(crds, crd)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read CRDs under %s: %w", e.Resolver.CRDKeyPrefix(), err)
	}
	if endpoints != nil {
		objs := make([]*apiextensionsv1.CustomResourceDefinition, len(crds))
		for i, crd := range crds {
			objs[i] = crd.Object
		}
		loaded, err := e.loadWebhookEndpoints(ctx, objs)
		if err != nil {
			return err
		}
		*endpoints = *loaded
	}
	for _, crd := range crds {
		if e.Config.CustomResources != nil {
			codec, err := e.Config.CustomResources(crd.Object)
			if err != nil {
				crd.Err = fmt.Errorf("CRD %s: %w", crd.Object.Name, err)
			} else {
				crd.Codec = codec
				e.Decoder.AddCustomResource(crd.Resource, codec)
				e.Planner.AddCustomResource(crd.Resource, codec)
			}
		}
		e.CRDs = append(e.CRDs, crd)
	}
	return nil
}

// Narrow returns a run over the given resources only, as Config.Resources
// would select them (no namespace filter), sharing e's codecs, encryption,
// CRDs and decisions: nothing is set up again. Close e, not the result.
func (e *Env) Narrow(resources ...schema.GroupResource) (*Env, error) {
	n := *e
	n.Config.Resources = make([]string, len(resources))
	for i, gr := range resources {
		n.Config.Resources[i] = gr.String()
	}
	n.Config.Namespace = ""
	n.narrowed = true // shared: closing n closes nothing
	n.Prefixes, n.Filter = nil, nil
	if err := n.selectPrefixes(); err != nil {
		return nil, err
	}
	return &n, nil
}

func (e *Env) selectPrefixes() error {
	cfg := e.Config
	e.Skip = nil
	for _, r := range cfg.Exclude {
		gr, err := e.Resolver.ParseResource(r)
		if err != nil {
			return err
		}
		p, err := e.Resolver.KeyPrefix(gr, "")
		if err != nil {
			return err
		}
		e.Skip = append(e.Skip, p)
	}
	if len(cfg.Resources) == 0 {
		if cfg.Namespace != "" {
			return &NamespaceWithoutResourceError{Namespace: cfg.Namespace}
		}
		e.Prefixes = []string{strings.TrimSuffix(cfg.Prefix, "/") + "/"}
		return nil
	}
	e.Filter = map[schema.GroupResource]bool{}
	for _, r := range cfg.Resources {
		gr, err := e.Resolver.ParseResource(r)
		if err != nil {
			return err
		}
		e.Filter[gr] = true
		p, err := e.Resolver.KeyPrefix(gr, cfg.Namespace)
		if err != nil {
			return err
		}
		e.Prefixes = append(e.Prefixes, p)
	}
	sort.Strings(e.Prefixes)
	// Drop a prefix contained in another ("services/" would contain "services/specs/").
	out := e.Prefixes[:0]
	for _, p := range e.Prefixes {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	e.Prefixes = out
	return nil
}

// skip leaves out the keys under Skip.
func (e *Env) skip(page []etcdscan.KV) []etcdscan.KV {
	if len(e.Skip) == 0 {
		return page
	}
	out := make([]etcdscan.KV, 0, len(page))
	for _, kv := range page {
		if !slices.ContainsFunc(e.Skip, func(p string) bool { return strings.HasPrefix(kv.Key, p) }) {
			out = append(out, kv)
		}
	}
	return out
}

// NamespaceWithoutResourceError is a namespace filter (Config.Namespace)
// without a resource filter: the keyspace is laid out by resource first, so
// a namespace alone selects no key range.
type NamespaceWithoutResourceError struct {
	Namespace string
}

func (e *NamespaceWithoutResourceError) Error() string {
	return "a namespace filter needs a resource filter: the keyspace is laid out by resource first"
}

const (
	// DecodeOnly decodes (inventory); decisions carry From but no To.
	DecodeOnly Mode = iota
	// Decide also encodes to the target, decides, and encrypts the value to
	// write (migrate).
	Decide
	// Classify decides as Decide does without the value to write (verify).
	Classify
)
