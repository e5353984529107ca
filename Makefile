# kube-etcd-migrate. `make demo` and `make test` are the two commands a newcomer needs.
GO            ?= go
BIN           := bin/kube-etcd-migrate
TOOLS         := $(CURDIR)/bin/tools
STATICCHECK   := $(TOOLS)/staticcheck
STATICCHECK_VERSION := v0.8.2
# The whole suite, e2e against a real kube-apiserver included, on a 2-core machine.
TEST_TIMEOUT  ?= 75m
BENCH_N       ?= 100000
# The snapshot phase of `make bench`: a backup of this many objects (about 1.8 GB).
BENCH_SNAPSHOT_N ?= 1000000
# The version stamped into `make build`: a v* tag, else the commit ("-dirty" with
# uncommitted changes).
VERSION       ?= $(shell git describe --tags --match 'v*' --always --dirty 2>/dev/null || echo devel)
LDFLAGS       := -X kube-etcd-migrate/internal/buildinfo.version=$(VERSION)
# `make release` builds the commit HEAD names, from a clean copy: its version has no
# "-dirty". Override: make release RELEASE_VERSION=v1.0.0
RELEASE_COMMIT    := $(shell git rev-parse HEAD 2>/dev/null)
RELEASE_VERSION   ?= $(shell git describe --tags --match 'v*' --always HEAD 2>/dev/null || echo devel)
RELEASE_LDFLAGS   := -s -w -X kube-etcd-migrate/internal/buildinfo.version=$(RELEASE_VERSION) -X kube-etcd-migrate/internal/buildinfo.commit=$(RELEASE_COMMIT)
RELEASE_PLATFORMS := linux/amd64 linux/arm64

.PHONY: build release demo test lint releases bump-kubernetes fuzz bench bench-apiserver clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) .

# Static binaries (no cgo, no libc needed on the node) for the control-plane
# platforms and their SHA256SUMS. Built from `git archive HEAD`, not the working
# tree: a release is exactly the commit it is stamped with, whatever is being
# edited meanwhile (uncommitted changes are not in it).
release:
	@test -n "$(RELEASE_COMMIT)" || { echo "make release: not a git checkout"; exit 1; }
	rm -rf dist && mkdir -p dist
	src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	git archive --format=tar HEAD | tar -x -C "$$src" && \
	for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		echo "building dist/kube-etcd-migrate-$$os-$$arch: $(RELEASE_VERSION) (commit $(RELEASE_COMMIT))"; \
		(cd "$$src" && CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
			-ldflags "$(RELEASE_LDFLAGS)" -o "$(CURDIR)/dist/kube-etcd-migrate-$$os-$$arch" .) || exit 1; \
	done
	cd dist && sha256sum kube-etcd-migrate-* > SHA256SUMS && cat SHA256SUMS

demo:
	$(GO) run ./cmd/demo

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

# The previous releases' binaries the tests play (internal/modbuild: the
# previous Kubernetes release's kube-apiserver, the two etcd server minors before the linked one), each
# built once from its own module into the user cache, before the test binaries
# run in parallel; a later run finds them there.
releases:
	$(GO) run ./internal/modbuild/prebuild

# Move to another Kubernetes release (docs/releasing.md): make bump-kubernetes KUBERNETES=v1.38.0
bump-kubernetes:
	@test -n "$(KUBERNETES)" || { echo "usage: make bump-kubernetes KUBERNETES=vX.Y.Z"; exit 2; }
	$(GO) run ./internal/modbuild/bump $(KUBERNETES)

# Every test, including the end-to-end tests that start kube-apiserver in-process
# and the previous release's kube-apiserver as a process.
test: lint releases
	$(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./...

# Short fuzzing of the decoders (the seed corpora already run in `make test`).
fuzz:
	$(GO) test ./decode/ -run '^$$' -fuzz FuzzDecode -fuzztime 60s
	$(GO) test ./customresource/ -run '^$$' -fuzz FuzzDecode -fuzztime 60s

# BENCH_FLAGS adds flags, e.g. BENCH_FLAGS="-baseline OLD-BINARY" to measure
# another build beside this one in every repetition (docs/benchmarks.md).
bench:
	$(GO) run ./bench -n $(BENCH_N) -snapshot-n $(BENCH_SNAPSHOT_N) $(BENCH_FLAGS)

# The incumbent beside the tool: the mixed dataset only, the apiserver path on
# 20,000 of its objects (about 3 minutes), figures in bench/results-apiserver.*.
bench-apiserver:
	$(GO) run ./bench -dataset mixed -n $(BENCH_N) -apiserver -apiserver-n 20000 -sweep=false -snapshot=false -json bench/results-apiserver.json

clean:
	rm -rf bin dist
