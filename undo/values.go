package undo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
)

// valueCheck counts the old values of a journal by provider, key and state,
// decrypting them with the configuration when there is one.
type valueCheck struct {
	enc      *encryption.Transformers
	prefix   string
	resolver *decode.Resolver
	noRes    bool // the resolver could not be built: every key is guessed
	sampled  map[string]bool
	byKey    map[[2]string]*ValueCount
	order    [][2]string
	// plugins: the KMS plugins asked whether they work, by resource and
	// provider:name (nil: it works).
	plugins map[string]*encryption.KMSPluginError
}

func newValueCheck(opts CheckOptions) *valueCheck {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "/registry"
	}
	return &valueCheck{enc: opts.Encryption, prefix: prefix, sampled: map[string]bool{}, byKey: map[[2]string]*ValueCount{}}
}

func (v *valueCheck) count(enc, state, key, detail string) {
	k := [2]string{enc, state}
	c := v.byKey[k]
	if c == nil {
		c = &ValueCount{Encryption: enc, State: state, FirstKey: key, Detail: detail}
		v.byKey[k] = c
		v.order = append(v.order, k)
	}
	c.Values++
}

// counts are the counts, unreadable first, then by provider:key.
func (v *valueCheck) counts() []ValueCount {
	out := make([]ValueCount, 0, len(v.order))
	for _, k := range v.order {
		out = append(out, *v.byKey[k])
	}
	rank := map[string]int{ValueUnreadable: 0, ValueUnchecked: 1, ValueReadable: 2, ValueQuarantined: 3, ValueNotRead: 4}
	sort.SliceStable(out, func(i, j int) bool {
		if a, b := rank[out[i].State], rank[out[j].State]; a != b {
			return a < b
		}
		return out[i].Encryption < out[j].Encryption
	})
	return out
}

// add counts the value a rollback of record r would put back (none for
// records that put back no value).
func (v *valueCheck) add(ctx context.Context, r *checkRecord, val []byte) error {
	switch r.Op {
	case "intent":
	case "delete-intent":
		if r.Reason != "" && r.Reason != "rollback" {
			// quarantine removed it as unreadable (or not an object): put back as it was.
			v.count(encryption.EnvelopeInfo(val).String(), ValueQuarantined, r.Key, "")
			return nil
		}
	default:
		return nil
	}
	info := encryption.EnvelopeInfo(val)
	name := info.String()
	if v.enc == nil {
		v.count(name, ValueUnchecked, r.Key, "")
		return nil
	}
	gr, ok := v.resource(r.Key)
	if !ok {
		v.count(name, ValueNotRead, r.Key, "")
		return nil
	}
	if info.Provider == encryption.ProviderKMSv1 {
		// Each KMS v1 value is a call to its plugin: the first of each
		// provider and resource is decrypted, the rest checked by envelope.
		s := gr.String() + " " + name
		if v.sampled[s] {
			if v.enc.CanRead(gr, info) {
				v.count(name, ValueReadable, r.Key, "")
			} else {
				v.count(name, ValueUnreadable, r.Key, fmt.Sprintf("stored as %s, which the configuration for %s does not have", name, gr))
			}
			return nil
		}
		v.sampled[s] = true
	}
	_, _, err := v.enc.Decrypt(ctx, gr, r.Key, val)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		detail := err.Error()
		var de *encryption.DecryptError
		if errors.As(err, &de) {
			if de.Plugin != nil {
				// No answer: every value under a data key not yet
				// decrypted would wait out the plugin's timeout.
				return &PluginStopError{Key: r.Key, Plugin: de.Plugin}
			}
			detail = de.Detail
		}
		if p := v.pluginDown(ctx, gr, info); p != nil {
			return &PluginStopError{Key: r.Key, Plugin: p}
		}
		v.count(name, ValueUnreadable, r.Key, detail)
		return nil
	}
	v.count(name, ValueReadable, r.Key, "")
	return nil
}

// pluginDown is the KMS plugin of info, a value's envelope, when it does
// not work (asked once per plugin: Transformers.CheckKMSPlugins): a value
// it could not decrypt is then no value's fault (its plugin was down when
// the tool started, or answers unhealthy). nil for any other provider, or a
// plugin that works (the value itself is refused).
func (v *valueCheck) pluginDown(ctx context.Context, gr schema.GroupResource, info encryption.Info) *encryption.KMSPluginError {
	if info.Provider != encryption.ProviderKMSv1 && info.Provider != encryption.ProviderKMSv2 {
		return nil
	}
	id := gr.String() + " " + info.String()
	if p, asked := v.plugins[id]; asked {
		return p
	}
	if v.plugins == nil {
		v.plugins = map[string]*encryption.KMSPluginError{}
	}
	var down *encryption.KMSPluginError
	for _, p := range v.enc.CheckKMSPlugins(ctx, []schema.GroupResource{gr}) {
		if p.Provider == info.Provider && p.Name == info.KeyName {
			down = p
		}
	}
	v.plugins[id] = down
	return down
}

// PluginStopError stops the check of the values a journal would put back
// (a rollback's, before its first write; verify's of a state directory): a
// KMS plugin that does not answer, or does not work, could not decrypt Key's.
// No value's fault: nothing is counted unreadable, nothing was written.
type PluginStopError struct {
	Key    string
	Plugin *encryption.KMSPluginError
}

func (e *PluginStopError) Error() string {
	return fmt.Sprintf("%s: %v; the values a rollback puts back are each decrypted with the cluster's configuration before its first write, and that needs the plugin", e.Key, e.Plugin)
}

func (e *PluginStopError) Unwrap() error { return e.Plugin }

// resource is the group/resource kube-apiserver reads key as (a custom
// resource's by its key: no CRD is known here); false for a key no
// kube-apiserver reads as an object.
func (v *valueCheck) resource(key string) (schema.GroupResource, bool) {
	if v.resolver == nil && !v.noRes {
		storage, err := decode.NewStorageConfig("")
		if err != nil {
			v.noRes = true
		} else {
			v.resolver = decode.NewResolver(v.prefix, storage)
		}
	}
	if v.resolver == nil || !strings.HasPrefix(key, strings.TrimSuffix(v.prefix, "/")+"/") {
		if !strings.HasPrefix(key, strings.TrimSuffix(v.prefix, "/")+"/") {
			return schema.GroupResource{}, false
		}
		return decode.GuessResource(v.prefix, key), true
	}
	info, err := v.resolver.Resolve(key)
	if err == nil {
		return info.Resource, true
	}
	var de *decode.Error
	if errors.As(err, &de) && de.Reason == decode.ReasonOrphaned && de.Orphan == decode.OrphanCRDMissing {
		return decode.GuessResource(v.prefix, key), true
	}
	return schema.GroupResource{}, false
}
