package etcdscan

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/mem"
	"kube-etcd-migrate/internal/textfmt"
)

// Defaults of the connection (the command line's flags default to them);
// dial and command timeouts are etcdctl's.
const (
	DefaultEndpoint       = "127.0.0.1:2379"
	DefaultDialTimeout    = 2 * time.Second
	DefaultCommandTimeout = 5 * time.Second
)

// Config says how to reach etcd: plain data (the command line's flags, as
// etcdctl's global flags, are read into it by the command layer).
type Config struct {
	Endpoints      []string
	CACert         string // --cacert: PEM bundle of CAs that sign the server certificates
	Cert, Key      string // --cert/--key: client certificate and its private key
	Username       string // --user (etcdctl form "name" or "name:password")
	Password       string // --password; never printed
	DialTimeout    time.Duration
	CommandTimeout time.Duration
}

// Setting names a Config field in the errors of Validate and Connect, as
// plain words; the command layer names the flag that sets it.
type Setting string

// The settings of Config.
const (
	SettingEndpoints      Setting = "endpoints"
	SettingDialTimeout    Setting = "dial timeout"
	SettingCommandTimeout Setting = "command timeout"
	SettingUser           Setting = "user"
	SettingPassword       Setting = "password"
	SettingCACert         Setting = "CA certificate"
	SettingCert           Setting = "client certificate"
	SettingKey            Setting = "client key"
)

// SettingError is a Config value that cannot be used (Validate, Connect
// before any endpoint is contacted).
type SettingError struct {
	Settings []Setting // the value at fault (two: a certificate and key that do not pair)
	Msg      string    // what is wrong with it ("" when Err says it)
	Err      error
}

func (e *SettingError) Error() string {
	names := make([]string, len(e.Settings))
	for i, s := range e.Settings {
		names[i] = string(s)
	}
	return "etcd " + strings.Join(names, " and ") + ": " + e.Detail()
}

// Detail is what is wrong, without the settings' names.
func (e *SettingError) Detail() string {
	switch {
	case e.Msg != "" && e.Err != nil:
		return e.Msg + ": " + e.Err.Error()
	case e.Err != nil:
		return e.Err.Error()
	}
	return e.Msg
}

func (e *SettingError) Unwrap() error { return e.Err }

// ConnectError is a connection that failed in a way a setting can mend (a
// user, a certificate, a longer dial timeout): Msg says what happened, Fix
// which settings would mend it.
type ConnectError struct {
	Msg string
	Fix []Setting
}

func (e *ConnectError) Error() string { return e.Msg }

// Validate checks the configuration without contacting etcd.
func (cfg Config) Validate() error {
	if len(cfg.Endpoints) == 0 {
		return &SettingError{Settings: []Setting{SettingEndpoints}, Msg: "no endpoint given"}
	}
	if cfg.DialTimeout <= 0 {
		return &SettingError{Settings: []Setting{SettingDialTimeout}, Msg: fmt.Sprintf("must be positive, got %s", cfg.DialTimeout)}
	}
	if cfg.CommandTimeout <= 0 {
		return &SettingError{Settings: []Setting{SettingCommandTimeout}, Msg: fmt.Sprintf("must be positive, got %s", cfg.CommandTimeout)}
	}
	if cfg.Password != "" && cfg.Username == "" {
		return &SettingError{Settings: []Setting{SettingPassword}, Msg: "given without a user"}
	}
	if cfg.Cert != "" && cfg.Key == "" {
		return &SettingError{Settings: []Setting{SettingCert}, Msg: "given without a client key"}
	}
	if cfg.Key != "" && cfg.Cert == "" {
		return &SettingError{Settings: []Setting{SettingKey}, Msg: "given without a client certificate"}
	}
	_, err := cfg.tlsConfig()
	return err
}

// usesTLS reports whether scheme-less endpoints should default to https.
func (cfg Config) usesTLS() bool { return cfg.CACert != "" || cfg.Cert != "" }

// endpoints returns the endpoints with an explicit scheme.
func (cfg Config) endpoints() []string {
	out := make([]string, 0, len(cfg.Endpoints))
	for _, ep := range cfg.Endpoints {
		switch {
		case strings.Contains(ep, "://"), strings.HasPrefix(ep, "unix:"), strings.HasPrefix(ep, "unixs:"):
			out = append(out, ep)
		case cfg.usesTLS():
			out = append(out, "https://"+ep)
		default:
			out = append(out, "http://"+ep)
		}
	}
	return out
}

// tlsConfig loads the certificate files; nil when no TLS file is configured.
func (cfg Config) tlsConfig() (*tls.Config, error) {
	if !cfg.usesTLS() {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CACert != "" {
		pem, err := os.ReadFile(cfg.CACert)
		if err != nil {
			return nil, &SettingError{Settings: []Setting{SettingCACert}, Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &SettingError{Settings: []Setting{SettingCACert}, Msg: cfg.CACert + " holds no PEM certificate"}
		}
		tc.RootCAs = pool
	}
	if cfg.Cert != "" {
		if _, err := os.Stat(cfg.Cert); err != nil {
			return nil, &SettingError{Settings: []Setting{SettingCert}, Err: err}
		}
		if _, err := os.Stat(cfg.Key); err != nil {
			return nil, &SettingError{Settings: []Setting{SettingKey}, Err: err}
		}
		pair, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
		if err != nil {
			return nil, &SettingError{Settings: []Setting{SettingCert, SettingKey}, Msg: cfg.Cert + " and " + cfg.Key, Err: err}
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// Connect opens a client and probes every endpoint within the dial timeout.
// A failure comes back as one line saying what is wrong: an unreachable
// endpoint (named), a TLS/certificate problem, or an authentication problem.
// The client's own logging is silenced. The caller closes the client.
func Connect(ctx context.Context, cfg Config) (*clientv3.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, _ := cfg.tlsConfig()
	eps := cfg.endpoints()
	ccfg := clientv3.Config{
		Endpoints:   eps,
		TLS:         tc,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DialTimeout: cfg.DialTimeout,
		Logger:      zap.NewNop(),
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		// New only fails early on configuration or, with --user, on Authenticate.
		return nil, describeErr(ctx, cfg, tc, strings.Join(eps, ","), err)
	}
	rememberConfig(cli, ccfg)
	if err := probe(ctx, cli, cfg, tc); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

// BufferPool is gRPC's own tiered buffer pool with the tiers between 32 KiB
// and 1 MiB that its default lacks, for experimental.SetDefaultBufferPool in a
// command's init. gRPC marshals each request into a pooled buffer of the
// smallest tier that fits it, and clears the whole buffer on every reuse:
// with the default tiers (256 B, a page, 16 KiB, 32 KiB, 1 MiB) a write
// transaction of 16 two-kilobyte values (about 37 KiB) takes a 1 MiB buffer,
// so the 16 writers in flight held 16 MiB of a 64 MiB memory limit, and every
// transaction cleared a megabyte.
func BufferPool() mem.BufferPool {
	return mem.NewTieredBufferPool(256, 4<<10, 16<<10, 32<<10, 64<<10, 128<<10, 256<<10, 512<<10, 1<<20)
}

// probe asks every endpoint for its status (reachability, TLS), then reads one
// key through the cluster (authentication), like `etcdctl endpoint health`.
func probe(ctx context.Context, cli *clientv3.Client, cfg Config, tc *tls.Config) error {
	for _, ep := range cli.Endpoints() {
		pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		_, err := cli.Status(pctx, ep)
		cancel()
		if err != nil {
			return describeErr(ctx, cfg, tc, ep, err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	_, err := cli.Get(pctx, "health")
	if err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return describeErr(ctx, cfg, tc, strings.Join(cli.Endpoints(), ","), err)
	}
	return nil
}

// describeErr turns a failed connection attempt into one line.
func describeErr(ctx context.Context, cfg Config, tc *tls.Config, ep string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("etcd %s: %w", ep, ctx.Err())
	}
	switch {
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return &ConnectError{Msg: fmt.Sprintf("etcd authentication: %s requires a user (a user and password, or a client certificate whose CN is an etcd user): %s", ep, textfmt.OneLine(err.Error())), Fix: []Setting{SettingUser, SettingPassword}}
	case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrUserNotFound):
		return fmt.Errorf("etcd authentication failed at %s: invalid user name or password", ep)
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return fmt.Errorf("etcd authentication: user %q is not permitted at %s: %s", cfg.Username, ep, textfmt.OneLine(err.Error()))
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		// The server answered: connection and TLS are fine.
		return fmt.Errorf("etcd %s: %s", ep, ee.Error())
	}
	// Find out what is wrong by dialing the endpoint(s) ourselves.
	for _, one := range strings.Split(ep, ",") {
		if d := diagnose(ctx, cfg, tc, one); d != nil {
			return d
		}
	}
	return &ConnectError{Msg: fmt.Sprintf("etcd %s: no answer within the dial timeout %s: %s", ep, cfg.DialTimeout, textfmt.OneLine(err.Error())), Fix: []Setting{SettingDialTimeout}}
}

// diagnose dials one endpoint with TCP and, for https, with TLS, and returns
// a one-line error naming the problem, or nil when both work.
func diagnose(ctx context.Context, cfg Config, tc *tls.Config, ep string) error {
	scheme, hostport, ok := strings.Cut(ep, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return nil
	}
	timeout := cfg.DialTimeout
	if timeout > 2*time.Second {
		timeout = 2 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", hostport)
	if err != nil {
		return fmt.Errorf("etcd endpoint %s unreachable: %s", ep, textfmt.OneLine(err.Error()))
	}
	defer conn.Close()
	host, _, _ := net.SplitHostPort(hostport)
	if scheme == "http" {
		// A TLS server on an http:// endpoint answers a TLS hello.
		probeCfg := &tls.Config{InsecureSkipVerify: true, ServerName: host} //nolint:gosec // only to detect that the server speaks TLS
		tconn := tls.Client(conn, probeCfg)
		_ = tconn.SetDeadline(time.Now().Add(timeout))
		if tconn.HandshakeContext(dctx) == nil {
			return &ConnectError{Msg: fmt.Sprintf("etcd endpoint %s serves TLS: use an https:// endpoint and a CA certificate (with a client certificate and key if it wants them)", ep), Fix: []Setting{SettingCACert, SettingCert, SettingKey}}
		}
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if tc != nil {
		c = tc.Clone()
	}
	c.ServerName = host
	tconn := tls.Client(conn, c)
	_ = tconn.SetDeadline(time.Now().Add(timeout))
	if err := tconn.HandshakeContext(dctx); err != nil {
		return tlsError(cfg, ep, err)
	}
	// With TLS 1.3 a server rejects the client certificate after the handshake:
	// the alert arrives on the first read. A server that accepted us sends nothing.
	_ = tconn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	_, err = tconn.Read(b[:])
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, io.EOF) {
		return tlsError(cfg, ep, err)
	}
	return nil
}

func tlsError(cfg Config, ep string, err error) error {
	msg := textfmt.OneLine(err.Error())
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	switch {
	case errors.As(err, &ua):
		ca := "the system roots"
		if cfg.CACert != "" {
			ca = "the CA certificate " + cfg.CACert
		}
		return &ConnectError{Msg: fmt.Sprintf("etcd TLS: the certificate of %s is not signed by %s: %s", ep, ca, msg), Fix: []Setting{SettingCACert}}
	case errors.As(err, &hn):
		return fmt.Errorf("etcd TLS: the certificate of %s does not name that host: %s", ep, msg)
	case errors.As(err, &ci):
		return fmt.Errorf("etcd TLS: the certificate of %s is invalid: %s", ep, msg)
	case strings.Contains(msg, "certificate required"), strings.Contains(msg, "bad certificate"),
		strings.Contains(msg, "unknown certificate authority"), strings.Contains(msg, "certificate unknown"),
		strings.Contains(msg, "expired certificate"), strings.Contains(msg, "revoked"):
		if cfg.Cert == "" {
			return &ConnectError{Msg: fmt.Sprintf("etcd TLS: %s requires a client certificate and key (%s)", ep, msg), Fix: []Setting{SettingCert, SettingKey}}
		}
		return &ConnectError{Msg: fmt.Sprintf("etcd TLS: %s rejected the client certificate %s (%s)", ep, cfg.Cert, msg), Fix: []Setting{SettingCert, SettingKey}}
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("etcd TLS: %s does not speak TLS: use an http:// endpoint (%s)", ep, msg)
	}
	return fmt.Errorf("etcd TLS handshake with %s failed: %s", ep, msg)
}

// oneLine flattens an error message onto one line.
