package command

import (
	"fmt"
)

// Exit codes, documented in docs/commands.md and in --help.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitStale       = 3
	exitUnreadable  = 4
	exitCodesHelpTx = `EXIT CODES:
   0  success (verify: every object current)
   1  failed, nothing lost (etcd unreachable, preflight refusal, write failures,
      stopped before etcd's quota or at its first NOSPACE or permission refusal:
      one line names the cause and the remedy; the journal is intact)
   2  usage error (bad flag or argument; a manifest path or KMS plugin socket
      under no hostPath mount)
   3  verify: something is stale, everything is readable
   4  verify/migrate: something is unreadable (no key for it, corrupt, unknown kind,
      fields these types would lose); migrate left those objects untouched;
      verify --fail-on-orphaned: also a key no resource owns (orphaned keys are
      reported, and do not change the exit code otherwise)`
)

// exitError carries an exit code through urfave/cli.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }

func (e *codeError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &codeError{code: exitUsage, err: fmt.Errorf(format, args...)}
}
