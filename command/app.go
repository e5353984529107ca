// Package command is kube-etcd-migrate's command line, as etcdctl's
// ctlv3/command: the urfave/cli app and its exit codes (app.go, exit.go), one
// file per command named after it (inventory.go, inspect.go, verify.go,
// migrate.go, rollback.go, quarantine.go, version.go, completion.go), each
// with its options read from the flags once and validated before any I/O
// (options.go says the shape), the flag groups the commands share and their
// options (global_flags.go, apiserver_flags.go, etcd_flags.go,
// snapshot_flags.go, target_flags.go, undo.go, liveness_flags.go,
// space_flags.go), what every command opens (session.go),
// flags anywhere on the line (args.go), and all the printing: the printers by
// output format (printer.go: table, json with the build stamp, yaml) and each
// report's table (printer_*.go), metrics.go, progress.go; the commands and
// their flags as data for the man page and docs/commands.md' flag tables
// (reference.go). The binary's main calls Run. See docs/commands.md.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/crash"
)

// Run is the binary: it runs the command line args (args[0] the program's
// name), writes to stdout and stderr, and returns the exit code. It first sets
// what is process-wide: gRPC's and klog's logging off, the Go runtime's memory
// limit and GC percent (unless GOMEMLIMIT and GOGC say otherwise).
func Run(args []string, stdout, stderr io.Writer) int {
	// k8s.io/apiserver's etcd3 package sends gRPC's logs to klog, which would print
	// every connection retry on stderr; the commands report errors once, on one line.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
	// kube-apiserver's transformers log each failed decryption through klog; the
	// reports already name those keys, and logs must not grow with the keyspace.
	silenceKlog()
	limitMemory()
	processStart = startOfProcess()
	return run(args, stdout, stderr)
}

// defaultMemoryLimit is the Go runtime's soft memory limit unless GOMEMLIMIT is
// set. A run holds a few pages of objects at a time (tens of MB), but allocates
// about its keyspace's size in short-lived garbage; without a limit the collector
// lets that garbage, and so the RSS, grow with the allocation rate.
const defaultMemoryLimit = 64 << 20

// gRPC's buffer pool with the tiers its default lacks (etcdscan.BufferPool
// says why). gRPC reads its default pool for marshalling (a dial option does
// not reach it), and it may be replaced only before any gRPC use: hence an
// init of this package, which only the binary (and its tests) import.
func init() {
	experimental.SetDefaultBufferPool(etcdscan.BufferPool())
}

// defaultGCPercent is the collector's GOGC unless GOGC is set: a run's live
// heap is small, so the collector runs half as often as at Go's default and
// the memory limit still bounds the heap (the measurements:
// docs/benchmarks.md).
const defaultGCPercent = 200

// migrateMemoryLimit is migrate's soft memory limit unless GOMEMLIMIT is set:
// its live heap is the largest of the commands' (the writes in flight, the
// liveness watch and the undo beside the decisions and the scan's chunk), so
// under defaultMemoryLimit its collector ran the most (the measurements:
// docs/benchmarks.md).
const migrateMemoryLimit = 80 << 20

// sqliteMigrateMemoryLimit is migrate's soft memory limit on a SQLite
// datastore unless GOMEMLIMIT is set: there kine's server and SQLite's page
// caches and statements live in the process beside the run, outside what the
// Go runtime counts (about 15-20 MB at 50,000 objects), so the run's own
// budget leaves them that room under the same private memory (the
// measurements: docs/benchmarks.md, k3s's SQLite datastore).
const sqliteMigrateMemoryLimit = defaultMemoryLimit

// setMemoryLimit sets the soft memory limit to limit, unless GOMEMLIMIT is set.
func setMemoryLimit(limit int64) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(limit)
	}
}

func limitMemory() {
	setMemoryLimit(defaultMemoryLimit)
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
}

func silenceKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

func run(args []string, stdout, stderr io.Writer) (code int) {
	// A panic outside a command's action (parsing the command line): no
	// command ran.
	defer func() {
		if v := recover(); v != nil {
			code = exitFor(internalError(stderr, "", crash.New("reading the command line", v)), stderr)
		}
	}()
	out := &output{}
	defer out.close()
	app := newApp(out.stream(stdout), out.stream(stderr))
	args = interspersed(app, args)
	if app.Metadata == nil {
		app.Metadata = map[string]interface{}{}
	}
	app.Metadata[argsMetadata] = args
	started := processStart
	if started.IsZero() {
		started = time.Now()
	}
	app.Metadata[startedMetadata] = started
	return exitFor(app.Run(args), app.ErrWriter)
}

// exitFor is the exit code of a command's error, after its "error:" line.
func exitFor(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ce *codeError
	if errors.As(err, &ce) {
		if ce.err != nil && !ce.quiet {
			fmt.Fprintf(stderr, "error: %s\n", cliMessage(ce.err))
		}
		return ce.code
	}
	fmt.Fprintf(stderr, "error: %s\n", cliMessage(err))
	return exitCodeOf(err)
}

// isUsage recognises urfave/cli's own usage errors that do not come through
// an OnUsageError (which every command and the app set, typing flag errors
// as codeError): the help command's unknown topic, an ExitCoder. The tool's
// own code never returns one.
func isUsage(err error) bool {
	var ec cli.ExitCoder
	return errors.As(err, &ec)
}

func newApp(stdout, stderr io.Writer) *cli.App {
	cli.HelpFlag = &cli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help"}
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version (see the version command)"}
	cli.VersionPrinter = func(c *cli.Context) {
		if err := writeVersion(c.App.Writer, "text"); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "error: %v\n", err)
		}
	}
	app := &cli.App{
		Name:                  "kube-etcd-migrate",
		Version:               buildinfo.Get().Version,
		EnableBashCompletion:  true,
		Usage:                 "rewrite Kubernetes objects in etcd to the current storage version and encryption key, offline",
		Writer:                stdout,
		ErrWriter:             stderr,
		ExitErrHandler:        func(*cli.Context, error) {},
		CustomAppHelpTemplate: cli.AppHelpTemplate + "\n" + environmentHelpTx + "\n\n" + exitCodesHelp("") + "\n",
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageErr("%v", err)
		},
		Commands: []*cli.Command{
			inventoryCommand(),
			inspectCommand(),
			verifyCommand(),
			planCommand(),
			migrateCommand(),
			rollbackCommand(),
			runsCommand(),
			quarantineCommand(),
			restoreCommand(),
			versionCommand(),
			completionCommand(),
		},
	}
	// Each command's --help ends with the exit codes it returns (exitCodes);
	// a panic of its action, or of a goroutine it started, is exitInternal.
	for _, cmd := range app.Commands {
		cmd.CustomHelpTemplate = cli.CommandHelpTemplate + "\n" + exitCodesHelp(cmd.Name) + "\n"
		cmd.Action = guarded(cmd.Name, cmd.Action)
	}
	return app
}

// guarded is a command's action with the panic boundary of the command: a
// panic of the action itself, or one that a goroutine it started carried back
// as its error (a *crash.Panic, through any wrapping), is one line on stderr
// saying it is a bug and what was written, and exitInternal.
func guarded(name string, action cli.ActionFunc) cli.ActionFunc {
	if action == nil {
		return nil
	}
	return func(c *cli.Context) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = crash.New("running "+name, v)
			}
			err = internalError(c.App.ErrWriter, name, err)
		}()
		return action(c)
	}
}

// internalError writes a *crash.Panic in err as the one line of a bug, and
// returns the error that exits exitInternal; any other err as it is.
func internalError(stderr io.Writer, name string, err error) error {
	var p *crash.Panic
	if !errors.As(err, &p) {
		return err
	}
	written := "nothing was written"
	if slices.Contains(writing, name) {
		written = "every write it made was journaled first (runs lists the run, rollback --run undoes it; with --no-undo nothing is kept)"
	}
	fmt.Fprintf(stderr, "%s — a bug of kube-etcd-migrate, please report it with this line; %s\n", p.Error(), written)
	return &codeError{code: exitInternal, err: p, quiet: true}
}

func commandUsageError(c *cli.Context, err error, _ bool) error {
	return usageErr("%s: %v", c.Command.Name, err)
}
