package command

import (
	"io"

	"github.com/urfave/cli/v2"
)

// Each command is three steps, as kubectl's Complete/Validate/Run:
//
//   - newXOptions(c) reads every flag of the command once into its
//     xOptions (the flag groups' own options: scanOptions, etcdOptions,
//     apiServerOptions, targetOptions, undoOptions, livenessOptions,
//     spaceOptions, outputSnapshotOptions), and where each precedence flag
//     came from (provenance). It is the only code that reads *cli.Context;
//   - validate refuses what the flags alone refuse (a value, a combination:
//     usage errors, exit 2) before any I/O: no etcd connection, no snapshot
//     file opened, no state directory touched, no profile written. Then the
//     paths the flags name are looked at (checkPath: a --snapshot that
//     exists, an --output-snapshot that cannot be written), still before
//     anything is opened;
//   - the command's run method opens etcd or the snapshot file (open),
//     runs its package and prints the report. What it refuses needs what
//     it opened (the target release, the state directory, etcd's answer).
//
// A new flag: declared in the command's (or its group's) flags function,
// read into a field by newXOptions, refused in validate when its value or
// its combination with another flag is wrong, used by the run method through
// the field, never by name.

// streams are where a command writes: its report (out) and its notes,
// warnings and errors (errOut).
type streams struct {
	out, errOut io.Writer
}

func streamsOf(c *cli.Context) streams {
	return streams{out: c.App.Writer, errOut: c.App.ErrWriter}
}
