package main

import (
	"math/rand"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	api "k8s.io/kubernetes/pkg/apis/core"
)

// The key-rotation dataset (-dataset rotation): the most common real job.
// Every object is a 2 KB Opaque secret written under aescbc key1 while the
// target configuration writes key2 ([key2, key1]), so every one is stale by its
// encryption only and its plaintext is rewritten byte for byte. Unlike the
// mixed dataset, whose objects carry no managedFields, each secret carries the
// managedFields entry a create through kube-apiserver leaves (`kubectl create
// secret generic`: manager kubectl-create, operation Update, apiVersion v1, the
// fields of its data keys and type), so the tool runs kube-apiserver's field
// manager on every one of them, as on a real cluster.

const (
	// RotationN is the dataset: 50,000 secrets.
	rotationN = 50000
	// The secret's data: with metadata and managedFields the stored plaintext
	// is about 2 KB (2,045 bytes before encryption).
	rotationCertBytes = 1712
)

func rotationSecret() *api.Secret {
	rnd := rand.New(rand.NewSource(3))
	cert := make([]byte, rotationCertBytes)
	rnd.Read(cert)
	password := make([]byte, 32)
	rnd.Read(password)
	return &api.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created,
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kubectl-create", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &created, FieldsType: "FieldsV1",
				FieldsV1: metav1.NewFieldsV1(`{"f:data":{".":{},"f:ca.crt":{},"f:password":{}},"f:type":{}}`),
			}}},
		Type: api.SecretTypeOpaque,
		Data: map[string][]byte{"ca.crt": cert, "password": password},
	}
}
