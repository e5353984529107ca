package decode

import (
	"fmt"
	"strings"

	"kube-etcd-migrate/internal/input"
)

// Reason classifies why a value could not be read (or must not be rewritten).
type Reason string

const (
	// ReasonNotObject: the key is not an API object (compact_rev_key, health, ...).
	ReasonNotObject Reason = "not-an-object"
	// ReasonUnknownResource: the key is under a resource's prefix but not laid
	// out as its objects are, its CRD is in etcd but cannot be used, or it holds
	// an object of a kind kube-apiserver serves under a prefix it does not read.
	ReasonUnknownResource Reason = "unknown-resource"
	// ReasonOrphaned: no built-in resource or CRD of this cluster owns the key
	// (Error.Orphan says why); kube-apiserver never reads it. Not a failure to
	// read: decisions give it the status orphaned.
	ReasonOrphaned Reason = "orphaned"
	// ReasonUnknownKind: the stored apiVersion/kind is not in the scheme.
	ReasonUnknownKind Reason = "unknown-kind"
	// ReasonUndecryptable: no configured provider/key can decrypt the value.
	ReasonUndecryptable Reason = "undecryptable"
	// ReasonCorruptEnvelope: the encryption envelope or protobuf envelope is malformed.
	ReasonCorruptEnvelope Reason = "corrupt-envelope"
	// ReasonCorruptPayload: the envelope is fine but the object inside does not decode.
	ReasonCorruptPayload Reason = "corrupt-payload"
	// ReasonWouldLoseFields: decoding and re-encoding in the stored version does not
	// give back the stored bytes (written by a newer release with fields these types
	// do not know); rewriting would lose data.
	ReasonWouldLoseFields Reason = "would-lose-fields"
	// ReasonConversionFailed: conversion to the target version failed (e.g. webhook).
	ReasonConversionFailed Reason = "conversion-failed"
)

// Error is a reportable failure for one key. Detail and Err never contain
// plaintext or key material.
type Error struct {
	Key    string
	Reason Reason
	Detail string // short human text: which provider/key name, which kind, ...
	Err    error
	// Orphan is set with ReasonOrphaned.
	Orphan Orphan
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: %s", e.Key, e.Reason)
	if e.Orphan != "" {
		msg += " (" + string(e.Orphan) + ")"
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error for key.
func Errorf(key string, reason Reason, err error, format string, args ...any) *Error {
	return &Error{Key: key, Reason: reason, Detail: fmt.Sprintf(format, args...), Err: err}
}

// MediaTypeError is a storage media type kube-apiserver does not store
// built-in resources in.
type MediaTypeError struct {
	MediaType string
}

func (e *MediaTypeError) Error() string { return e.Render(input.Words) }

// Render is the message with the media type's input spelled by spell.
func (e *MediaTypeError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("%s %q: want one of %s, %s, %s", spell(input.StorageMediaType), e.MediaType, MediaTypeProtobuf, MediaTypeJSON, MediaTypeYAML)
}

// ResourceError is a resource name (as --resource gives it) that names no
// built-in resource or CRD known to the Resolver, or, without a group, more
// than one (Ambiguous lists them, sorted).
type ResourceError struct {
	Name      string
	Ambiguous []string
}

func (e *ResourceError) Error() string { return e.Render(input.Words) }

// Render is the message with the resource's input spelled by spell.
func (e *ResourceError) Render(spell func(input.Name) string) string {
	if len(e.Ambiguous) > 0 {
		return fmt.Sprintf("%s %q is ambiguous: %s", spell(input.Resource), e.Name, strings.Join(e.Ambiguous, ", "))
	}
	return fmt.Sprintf("%s %q: no built-in resource or CRD of that name (use resource.group, e.g. deployments.apps)", spell(input.Resource), e.Name)
}
