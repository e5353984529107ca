package command

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
)

// etcdFlags are etcd's connection flags, named and defaulted like etcdctl's
// global flags (its ctlv3/command/global.go), each falling back to the
// ETCDCTL_* environment variable of the same name (which --help shows).
// etcdConfig puts kube-apiserver's configuration between the two: the
// command line, then kube-apiserver's, then the environment.
func etcdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{
			Name:    "endpoints",
			Usage:   "etcd client endpoints (comma separated); scheme-less endpoints get https:// when --cacert or --cert is given, else http://; without it (or --apiserver-manifest, --apiserver-flags-file), the etcd of the control plane found on the node (--distribution)",
			EnvVars: []string{"ETCDCTL_ENDPOINTS"},
		},
		&cli.StringFlag{Name: "cacert", Usage: "verify the etcd server certificates with this CA bundle", EnvVars: []string{"ETCDCTL_CACERT"}},
		&cli.StringFlag{Name: "cert", Usage: "client TLS certificate file", EnvVars: []string{"ETCDCTL_CERT"}},
		&cli.StringFlag{Name: "key", Usage: "client TLS private key file", EnvVars: []string{"ETCDCTL_KEY"}},
		&cli.StringFlag{Name: "user", Usage: "etcd user name[:password] when etcd auth is enabled", EnvVars: []string{"ETCDCTL_USER"}},
		&cli.StringFlag{Name: "password", Usage: "etcd password (prefer ETCDCTL_PASSWORD over the command line)", EnvVars: []string{"ETCDCTL_PASSWORD"}},
		&cli.DurationFlag{Name: "dial-timeout", Usage: "time to establish the connection and probe the cluster", Value: etcdscan.DefaultDialTimeout, EnvVars: []string{"ETCDCTL_DIAL_TIMEOUT"}},
		&cli.DurationFlag{Name: "command-timeout", Usage: "time limit of one etcd request", Value: etcdscan.DefaultCommandTimeout, EnvVars: []string{"ETCDCTL_COMMAND_TIMEOUT"}},
	}
}

// etcdOptions are etcdFlags as given.
type etcdOptions struct {
	endpoints                   []string
	cacert, cert, key           string
	user, password              string
	dialTimeout, commandTimeout time.Duration
	// userSet and passwordSet: --user and --password given, on the command
	// line or in the environment (a --snapshot-file read in place ignores them).
	userSet, passwordSet bool
}

func newEtcdOptions(c *cli.Context) etcdOptions {
	return etcdOptions{
		endpoints:      c.StringSlice("endpoints"),
		cacert:         c.String("cacert"),
		cert:           c.String("cert"),
		key:            c.String("key"),
		user:           c.String("user"),
		password:       c.String("password"),
		dialTimeout:    c.Duration("dial-timeout"),
		commandTimeout: c.Duration("command-timeout"),
		userSet:        c.IsSet("user"),
		passwordSet:    c.IsSet("password"),
	}
}

// validate refuses a --user the connection cannot take.
func (o etcdOptions) validate() error {
	if _, err := o.config(); err != nil {
		return usageErr("%v", err)
	}
	return nil
}

// config is the options as etcdscan's plain data, not yet validated
// (etcdscan.Config.Validate): etcdConfig replaces some values first
// (kube-apiserver's own etcd flags win over the environment's).
func (o etcdOptions) config() (etcdscan.Config, error) {
	cfg := etcdscan.Config{
		CACert:         o.cacert,
		Cert:           o.cert,
		Key:            o.key,
		Password:       o.password,
		DialTimeout:    o.dialTimeout,
		CommandTimeout: o.commandTimeout,
	}
	for _, e := range o.endpoints {
		for _, part := range strings.Split(e, ",") {
			if part = strings.TrimSpace(part); part != "" {
				cfg.Endpoints = append(cfg.Endpoints, part)
			}
		}
	}
	if o.user != "" {
		name, pass, hasPass := strings.Cut(o.user, ":")
		if name == "" {
			return etcdscan.Config{}, errors.New("--user: empty user name")
		}
		cfg.Username = name
		if hasPass {
			if cfg.Password != "" {
				return etcdscan.Config{}, errors.New("--user: password given both in --user and --password")
			}
			cfg.Password = pass
		}
	}
	return cfg, nil
}

// settingFlags are the flags that set etcdscan's settings.
var settingFlags = map[etcdscan.Setting]string{
	etcdscan.SettingEndpoints:      "--endpoints",
	etcdscan.SettingDialTimeout:    "--dial-timeout",
	etcdscan.SettingCommandTimeout: "--command-timeout",
	etcdscan.SettingUser:           "--user",
	etcdscan.SettingPassword:       "--password",
	etcdscan.SettingCACert:         "--cacert",
	etcdscan.SettingCert:           "--cert",
	etcdscan.SettingKey:            "--key",
}

// etcdError names the flags in an error of etcdscan's Validate or Connect:
// the flag whose value is at fault, or the flags that would mend a failed
// connection.
func etcdError(err error) error {
	flags := func(ss []etcdscan.Setting) []string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = settingFlags[s]
		}
		return out
	}
	var se *etcdscan.SettingError
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %s", strings.Join(flags(se.Settings), "/"), se.Detail())
	}
	var ce *etcdscan.ConnectError
	if errors.As(err, &ce) && len(ce.Fix) > 0 {
		return fmt.Errorf("%s (%s)", ce.Msg, strings.Join(flags(ce.Fix), ", "))
	}
	return err
}
