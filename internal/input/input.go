// Package input names what an operator gives the tool — a file, a release, a
// limit, a choice — so that a library error can say which of them is wrong, or
// which one would put it right, without spelling a command line. Library
// packages build such messages with Errorf, passing a Name where the message
// refers to an input; Error writes each Name as words ("output snapshot"). The
// command layer, which alone knows the flags, writes the same message with
// each Name as its flag (Render, or RenderAll for an error that wraps several),
// so that the words a user reads are the flags they typed. It imports nothing
// of the module.
package input

import (
	"bytes"
	"fmt"
	"strings"
)

// Name is one input, as words.
type Name string

// The inputs the library's messages refer to.
const (
	AllowLiveAPIServer       Name = "live kube-apiserver allowance"
	AllowUnverifiedJournal   Name = "unverified journal allowance"
	APIServerFlagsFile       Name = "kube-apiserver flags file"
	APIServerManifest        Name = "kube-apiserver manifest"
	CACert                   Name = "etcd CA certificate"
	ClientCert               Name = "client certificate"
	ClientKey                Name = "client key"
	CompactHistory           Name = "history compaction"
	ConversionWebhook        Name = "conversion webhook address"
	Distribution             Name = "installer"
	EncryptionProviderConfig Name = "encryption configuration"
	Endpoints                Name = "etcd endpoints"
	FailFast                 Name = "stop at the first failure"
	FailOnOrphaned           Name = "orphaned keys failing the gate"
	FeatureGates             Name = "feature gates"
	Force                    Name = "replacement of an existing output"
	Journal                  Name = "journal"
	Namespace                Name = "namespace"
	NoUndo                   Name = "no-undo choice"
	NodeRoot                 Name = "node root"
	OutputSnapshot           Name = "output snapshot"
	QuotaBackendBytes        Name = "etcd quota"
	Record                   Name = "migration records"
	Requested                Name = "requested migrations"
	Resource                 Name = "resource"
	Revision                 Name = "revision"
	RuntimeConfig            Name = "runtime configuration"
	SkipHashCheck            Name = "hash check skipping"
	Snapshot                 Name = "snapshot"
	SnapshotFile             Name = "snapshot file"
	StateDir                 Name = "state directory"
	StorageMediaType         Name = "storage media type"
	TargetVersion            Name = "target release"
	UndoDir                  Name = "rollback's undo directory"
	User                     Name = "etcd user"
)

// All is every Name, for the command layer's test that each has a flag.
func All() []Name {
	return []Name{AllowLiveAPIServer, AllowUnverifiedJournal, APIServerFlagsFile, APIServerManifest, CACert, ClientCert, ClientKey, CompactHistory,
		ConversionWebhook, Distribution, EncryptionProviderConfig, Endpoints, FailFast, FailOnOrphaned, FeatureGates, Force,
		Journal, Namespace, NoUndo, NodeRoot, OutputSnapshot, QuotaBackendBytes, Record, Requested,
		Resource, Revision, RuntimeConfig, SkipHashCheck, Snapshot, SnapshotFile, StateDir,
		StorageMediaType, TargetVersion, UndoDir, User}
}

// Error is a message that refers to inputs by Name. Its arguments are kept,
// so that it can be written again with other spellings of the names; the
// errors among them are what it wraps, as with fmt.Errorf's %w.
type Error struct {
	format string
	args   []any
}

// Errorf is fmt.Errorf whose Name arguments are written by the renderer. The
// arguments are kept until the message is written, which may be after the
// memory a []byte argument points into is gone (a snapshot file's mapping,
// unmapped when its reader closes): those are copied.
func Errorf(format string, args ...any) *Error {
	for i, a := range args {
		if b, ok := a.([]byte); ok {
			args[i] = bytes.Clone(b)
		}
	}
	return &Error{format: format, args: args}
}

// Words spells a Name as the library writes it.
func Words(n Name) string { return string(n) }

// Renderer is an error whose message refers to inputs: Error is
// Render(Words). An error type with fields of its own implements it to be
// written with flags as *Error is.
type Renderer interface {
	error
	Render(spell func(Name) string) string
}

// Error is the message with every Name as words.
func (e *Error) Error() string { return e.Render(Words) }

// Render is the message with every Name as spell gives it. Errors it wraps
// are written as their Error says (RenderAll rewrites those too).
func (e *Error) Render(spell func(Name) string) string {
	args := make([]any, len(e.args))
	for i, a := range e.args {
		if n, ok := a.(Name); ok {
			args[i] = spell(n)
		} else {
			args[i] = a
		}
	}
	return fmt.Sprintf(strings.ReplaceAll(e.format, "%w", "%v"), args...)
}

// Unwrap is what the message wraps (its error arguments).
func (e *Error) Unwrap() []error {
	var errs []error
	for _, a := range e.args {
		if err, ok := a.(error); ok {
			errs = append(errs, err)
		}
	}
	return errs
}

// RenderAll is err's message with the Names of every Renderer in its tree
// written as spell gives them: each one's words are its own Error text, which
// its wrappers carry verbatim, and are replaced there by its Render.
func RenderAll(err error, spell func(Name) string) string {
	msg := err.Error()
	var walk func(error)
	walk = func(err error) {
		if r, ok := err.(Renderer); ok {
			msg = strings.Replace(msg, r.Error(), r.Render(spell), 1)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				walk(next)
			}
		case interface{ Unwrap() []error }:
			for _, next := range u.Unwrap() {
				walk(next)
			}
		}
	}
	walk(err)
	return msg
}
