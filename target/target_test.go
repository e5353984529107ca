package target_test

import (
	"context"
	"errors"
	"testing"

	"kube-etcd-migrate/release"
	"kube-etcd-migrate/target"
)

// TestResolveRefusesWhatItCannotWriteAs: a writing run with no release named
// is refused with a typed error, as is a release out of the tool's range; a
// read-only run assumes the linked release.
func TestResolveRefusesWhatItCannotWriteAs(t *testing.T) {
	ctx := context.Background()
	_, err := target.Resolve(ctx, nil, target.Input{RequireRelease: true})
	var unknown *target.UnknownReleaseError
	if !errors.As(err, &unknown) || len(unknown.Versions) == 0 {
		t.Fatalf("no release named, writing: got %v, want *target.UnknownReleaseError listing the supported releases", err)
	}
	_, err = target.Resolve(ctx, nil, target.Input{Release: "1.20"})
	var rel *release.Error
	if !errors.As(err, &rel) {
		t.Fatalf("release 1.20: got %v, want *release.Error", err)
	}
	tg, err := target.Resolve(ctx, nil, target.Input{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.Named() || tg.Release() != release.Linked() {
		t.Fatalf("nothing named, read-only: release %s (named %v), want the linked %s assumed", tg.Release(), tg.Named(), release.Linked())
	}
	if tg.Storage() == nil || tg.Update() == nil || tg.Encryption() == nil {
		t.Fatal("a resolved target lacks its storage configuration, update path or encryption")
	}
	versions := release.Versions()
	oldest := versions[0]
	tg2, err := target.Resolve(ctx, nil, target.Input{Release: oldest, RequireRelease: true})
	if err != nil {
		t.Fatalf("release %s: %v", oldest, err)
	}
	defer tg2.Close()
	if !tg2.Named() || tg2.Release() != oldest {
		t.Fatalf("release %s given: got %s (named %v)", oldest, tg2.Release(), tg2.Named())
	}
}
