package command

import (
	"strings"
	"testing"

	"kube-etcd-migrate/plan"
)

// TestWebhookLineNamesTheGivenAddress: plan's line for a conversion webhook
// reached at an address the operator gave says so with the flag it came from.
func TestWebhookLineNamesTheGivenAddress(t *testing.T) {
	line := webhookLine(plan.WebhookCheck{CRD: "widgets.example.com", Target: "service webhooks/conv:443", Given: "127.0.0.1:8443", Answered: true, Address: "127.0.0.1:8443", Conversions: 2})
	if want := "ok: conversion webhook of widgets.example.com (service webhooks/conv:443 at 127.0.0.1:8443 (--conversion-webhook)) answered at 127.0.0.1:8443: 2 object(s) converted"; line != want {
		t.Errorf("line = %q\nwant   %q", line, want)
	}
	if line := webhookLine(plan.WebhookCheck{CRD: "widgets.example.com", Target: "service webhooks/conv:443", Error: "dial tcp: refused"}); strings.Contains(line, "--conversion-webhook") || !strings.Contains(line, "(service webhooks/conv:443) does not answer") {
		t.Errorf("without a given address: %q", line)
	}
}
