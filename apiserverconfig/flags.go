package apiserverconfig

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
)

func init() {
	// kube-apiserver's gate also has the logging gates (LoggingAlphaOptions,
	// LoggingBetaOptions, ...): cmd/kube-apiserver/app registers them at init,
	// and a command line that sets one must parse here too.
	utilruntime.Must(logsapi.AddFeatureGates(utilfeature.DefaultMutableFeatureGate))
}

// parsed is a command line parsed by kube-apiserver's own flag set.
type parsed struct {
	opts *options.ServerRunOptions
	reg  basecompatibility.ComponentGlobalsRegistry
	fs   *pflag.FlagSet
	from map[string]Source
	// emulated is its --emulated-version (emulatedVersion), nil when none;
	// badEmulated the value when kube-apiserver's registry refuses it.
	emulated    *version.Version
	badEmulated string
}

// parseCommandLine parses args (the command line of file name) then the
// tool's own --runtime-config and --feature-gates, with gate as
// kube-apiserver's feature gate. The gates are not applied yet (the
// registry's Set).
func parseCommandLine(args []string, in Input, name string, fileSource Source, gate featuregate.MutableVersionedFeatureGate) (*parsed, error) {
	opts, reg := newOptions(gate)
	fs := flagSet(opts)
	from := map[string]Source{}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%s: kube-apiserver would reject its command line: %w", name, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: kube-apiserver takes no arguments, found %q", name, fs.Arg(0))
	}
	fs.Visit(func(f *pflag.Flag) { from[f.Name] = fileSource })
	// The tool's own values come last, as a repeated flag would.
	for _, v := range in.RuntimeConfig {
		if err := fs.Set("runtime-config", v); err != nil {
			return nil, input.Errorf("%s %q: %w", input.RuntimeConfig, v, err)
		}
		from["runtime-config"] = FromTool
	}
	for _, v := range in.FeatureGates {
		if err := fs.Set("feature-gates", v); err != nil {
			return nil, input.Errorf("%s %q: %w", input.FeatureGates, v, err)
		}
		from["feature-gates"] = FromTool
	}
	p := &parsed{opts: opts, reg: reg, fs: fs, from: from}
	if from["emulated-version"] != "" {
		// A value the registry refuses is refused by its Set, or by
		// releaseOf for a release named.
		p.emulated, p.badEmulated, _ = emulatedVersion(fs.Lookup("emulated-version").Value)
	}
	return p, nil
}

// releaseOf is release rel run with the command line's --emulated-version.
func (p *parsed) releaseOf(rel *version.Version) (release.Release, error) {
	if p.badEmulated != "" {
		return release.Release{}, badEmulatedVersion(p.badEmulated)
	}
	return release.New(rel, p.emulated)
}

// emulate records where the release written for came from and, without
// an --emulated-version on the command line, makes the registry emulate it
// (its feature gates at that version; the min compatibility version is
// the release's own, rel.Effective).
func (p *parsed) emulate(rel release.Release, from Source) error {
	p.from["release"] = from
	if rel.Emulated() != nil {
		return nil
	}
	if err := p.fs.Set("emulated-version", rel.String()); err != nil {
		return release.Errorf(rel.String(), "%s %q: %w", input.TargetVersion, rel, err)
	}
	return nil
}

// newOptions returns kube-apiserver's options with private component globals
// (an effective version, and gate: a copy of the process's feature gate, or
// releaseFeatureGate's), so that parsing and validating a command line
// changes nothing process-wide.
func newOptions(gate featuregate.MutableVersionedFeatureGate) (*options.ServerRunOptions, basecompatibility.ComponentGlobalsRegistry) {
	opts := options.NewServerRunOptions()
	reg := basecompatibility.NewComponentGlobalsRegistry()
	ev := compatibility.DefaultBuildEffectiveVersion()
	if err := reg.Register(basecompatibility.DefaultKubeComponent, ev, gate); err != nil {
		panic(err) // a fresh registry has no component yet
	}
	opts.GenericServerRunOptions.ComponentGlobalsRegistry = reg
	return opts, reg
}

// flagSet is kube-apiserver's whole flag set, global flags included.
func flagSet(opts *options.ServerRunOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	fs.SetOutput(discard{})
	for _, f := range opts.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	// kube-apiserver's global flags (cmd/kube-apiserver/app: verflag and
	// globalflag): --version and --help take no part in storage.
	fs.String("version", "false", "")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.BoolP("help", "h", false, "")
	return fs
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// validate runs kube-apiserver's validation of the options the tool uses.
func validate(opts *options.ServerRunOptions, name string) error {
	if name == "" {
		name = "kube-apiserver flags"
	}
	var errs []error
	if name != "kube-apiserver flags" {
		// A whole command line from a file must be one kube-apiserver accepts;
		// without one, the tool's own etcd flags say where etcd is.
		errs = append(errs, opts.Etcd.Validate()...)
	}
	errs = append(errs, opts.APIEnablement.Validate(legacyscheme.Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme)...)
	errs = append(errs, opts.GenericServerRunOptions.ComponentGlobalsRegistry.Validate()...)
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s: kube-apiserver would reject it: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

// stripKubePrefix turns the registry's "kube:A=true,kube:B=false" (or the
// unprefixed form) into the gate's own "A=true,B=false".
func stripKubePrefix(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		p = strings.TrimPrefix(p, basecompatibility.DefaultKubeComponent+":")
		parts[i] = strings.TrimPrefix(p, ":")
	}
	return strings.Join(parts, ",")
}

// EventTTL is kube-apiserver's --event-ttl as its command line sets it, or
// kube-apiserver's own default: the lease TTL of an Event it creates.
func (c *Config) EventTTL() time.Duration {
	if c == nil || c.opts == nil {
		return options.NewServerRunOptions().EventTTL
	}
	return c.opts.EventTTL
}
