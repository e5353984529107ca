package customresource

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
)

// TestWebhookStoppedAnswering: a conversion webhook that converted an object
// in this run and then cannot be reached (its server gone) fails the next
// conversion with a *WebhookDownError naming the CRD, the webhook as the CRD
// names it and its address; a refusal it answers is the object's failure,
// and a codec whose webhook never answered reports each failure as it comes
// (nothing known to have gone).
func TestWebhookStoppedAnswering(t *testing.T) {
	ctx := context.Background()
	hook := &convWebhook{}
	srv := httptest.NewTLSServer(hook)
	t.Cleanup(srv.Close)
	url := srv.URL + "/convert"
	cc := apiextensionsv1.WebhookClientConfig{URL: ptr.To(url), CABundle: tlsServerCABundle(srv)}
	c := mustCodec(t, webhookCRD("v1", cc, []string{"v1"}), Options{})
	never := mustCodec(t, webhookCRD("v1", cc, []string{"v1"}), Options{})
	u, _, err := c.Decode(apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{"oldName": "n"})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Encode(ctx, u.DeepCopy()); err != nil {
		t.Fatalf("webhook up: %v", err)
	}
	hook.setMode("fail")
	_, err = c.Encode(ctx, u.DeepCopy())
	if err == nil || errors.As(err, new(*WebhookDownError)) {
		t.Fatalf("a refusal the webhook answered: %v, want the object's error", err)
	}
	hook.setMode("")

	srv.Close()
	_, err = c.Encode(ctx, u.DeepCopy())
	var down *WebhookDownError
	if !errors.As(err, &down) {
		t.Fatalf("webhook gone after answering: %v (%T), want a *WebhookDownError", err, err)
	}
	host := strings.TrimPrefix(srv.URL, "https://")
	if down.CRD != "widgets.stable.example.com" || down.Target != "url "+url || down.Address != host {
		t.Errorf("got %+v, want the CRD, url %s, address %s", down, url, host)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"CRD widgets.stable.example.com: conversion webhook url " + url + " at " + host + " stopped answering", "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q", want)
		}
	}
	if _, err := never.Encode(ctx, u.DeepCopy()); err == nil || errors.As(err, new(*WebhookDownError)) {
		t.Errorf("a webhook that never answered: %v, want the object's error", err)
	}
}
