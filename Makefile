# kube-etcd-migrate. `make demo` and `make test` are the two commands a newcomer needs.
GO            ?= go
# Every build, test and benchmark of the tool as the release builds it (internal/build/dist:
# no cgo), so that what is tested is what ships: kine's SQLite is then modernc.org/sqlite,
# as in the released binary (with cgo, kine would take mattn/go-sqlite3, a C library the
# release does not link).
export CGO_ENABLED := 0
BIN           := bin/kube-etcd-migrate
TOOLS         := $(CURDIR)/bin/tools
STATICCHECK   := $(TOOLS)/staticcheck
STATICCHECK_VERSION := v0.8.2
# The whole suite, e2e against a real kube-apiserver included, on a 2-core machine.
TEST_TIMEOUT  ?= 75m
BENCH_N       ?= 100000
# The snapshot phase of `make bench`: a backup of this many objects (about 1.8 GB).
BENCH_SNAPSHOT_N ?= 1000000
# The rollback phase of `make bench`: a journal of this many 2 KB rewrites (about 3 GB).
BENCH_ROLLBACK_N ?= 1000000
# The scale phase of `make bench`: verify --snapshot-file on files of this many objects and
# 4 × as many, side by side (small by default; `make bench-scale` is the production row).
BENCH_SCALE_N ?= 25000
# The kine phase of `make bench`: k3s's SQLite datastore of this many objects, the
# commands on it beside the same keys on etcd.
BENCH_KINE_N ?= 50000
# The tool's semantic version: internal/buildinfo's Release, the latest released entry of
# CHANGELOG.md (a test checks they agree). `make build` stamps nothing: its binary says
# it is a development build of that version, with the commit Go's VCS stamp records.
# `make release` builds RELEASE_COMMIT from a clean copy (git archive): stamped with its
# version when it is the commit that version's CHANGELOG.md entry names (read at HEAD: the
# entry is named in the commit after the release's), else a development build of the next
# version. RELEASE_VERSION=vX.Y.Z demands the release: refused on any other commit.
# docs/releasing.md. The tool is internal/build/dist, a module of its own.
RELEASE_COMMIT    ?= HEAD
RELEASE_VERSION   ?=
RELEASE_PLATFORMS ?= linux/amd64,linux/arm64
DIST              ?= dist
RELEASE_TOOL       = $(GO) -C internal/build/dist build -o '$(TOOLS)/dist' . && '$(TOOLS)/dist' -repo '$(CURDIR)' -commit '$(RELEASE_COMMIT)' -version '$(RELEASE_VERSION)' -platforms '$(RELEASE_PLATFORMS)' -go '$(GO)'

.PHONY: build release release-check docs demo test lint releases bump-kubernetes fuzz fuzz-targets bench bench-figures bench-smoke bench-apiserver bench-scale bench-production clean

build:
	$(GO) build -o $(BIN) .

# What a build of RELEASE_COMMIT is called, and why; nothing built.
release-check:
	@$(RELEASE_TOOL) -check

# For linux/amd64 and linux/arm64: the static binary (no cgo), its .deb and .rpm (binary in
# /usr/bin, man page, bash and zsh completion, /var/lib/kube-etcd-migrate 0700), an OCI
# image (the binary on an empty base) as an OCI layout in a tar file, a CycloneDX SBOM of
# each, and SHA256SUMS over all of them, into DIST (replaced). Built from `git archive` of
# the commit, not the working tree; every file's time is the commit's: two builds of a
# commit with the same Go release give the same bytes. The version is checked first.
release:
	$(RELEASE_TOOL) -out '$(abspath $(DIST))'

demo:
	$(GO) run ./cmd/demo

# The man page and completion files the packages install (packaging/) and the flag tables
# of docs/commands.md and docs/configuration.md, from the CLI's own definitions: run it after
# adding or changing a flag or command (internal/build/docgen's test fails until then).
docs:
	$(GO) run ./internal/build/docgen

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) -C internal/build/dist vet ./...
	$(GO) -C bench/figures vet ./...
	cd internal/build/dist && $(STATICCHECK) ./...
	cd bench/figures && $(STATICCHECK) ./...

# The previous releases' binaries the tests play (internal/build/modbuild: the
# previous Kubernetes release's kube-apiserver, the two etcd server minors before the linked one), each
# built once from its own module into the user cache, before the test binaries
# run in parallel; a later run finds them there.
releases:
	$(GO) run ./internal/build/modbuild/prebuild

# Move to another Kubernetes release (docs/releasing.md): make bump-kubernetes KUBERNETES=v1.38.0
bump-kubernetes:
	@test -n "$(KUBERNETES)" || { echo "usage: make bump-kubernetes KUBERNETES=vX.Y.Z"; exit 2; }
	$(GO) run ./internal/build/modbuild/bump $(KUBERNETES)

# Every test, including the end-to-end tests that start kube-apiserver in-process
# and the previous release's kube-apiserver as a process.
# The main module's output goes to TEST_LOG too: when a test fails, the lines that name it
# are printed again at the end, where a CI log's tail shows them (the e2e tests' in-process
# kube-apiserver logs thousands of lines after them).
TEST_LOG ?= $(or $(TMPDIR),/tmp)/kube-etcd-migrate-test.log
test: lint releases
	@echo "$(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./... (output also in $(TEST_LOG))"
	@{ $(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./... 2>&1; echo $$? > $(TEST_LOG).rc; } | tee $(TEST_LOG); \
	rc=$$(cat $(TEST_LOG).rc); rm -f $(TEST_LOG).rc; \
	if [ "$$rc" != 0 ]; then \
	  echo "== make test: go test exited $$rc; its lines that name a failure (all of it in $(TEST_LOG)):"; \
	  grep -aE -- '_test\.go:[0-9]+: ' $(TEST_LOG) | cut -c1-400 | tail -60; \
	  grep -aE -- '^[[:space:]]*--- FAIL|^FAIL|^panic: ' $(TEST_LOG) | cut -c1-400 | tail -40; \
	  exit 1; \
	fi
	$(GO) -C internal/build/dist test -timeout $(TEST_TIMEOUT) -count=1 ./...
	$(GO) -C bench/figures test -count=1 ./...
	$(MAKE) fuzz FUZZ_TIME=$(FUZZ_SHORT_TIME)
	$(MAKE) bench-smoke

# Every phase of `make bench` at a tiny size, one repetition, no figures
# written, in a 24 MiB quota that the rollback phase fills about as full as
# 1M keys fill 8 GiB: a change of the tool that breaks the benchmark (a new
# preflight refusing one of its runs) fails `make test`, not the next
# benchmark night (about 40 s).
bench-smoke:
	$(GO) run ./bench -n 3000 -rotation-n 1000 -cr-n 1000 -snapshot-n 3000 -rollback-n 3000 -scale-n 1000 -kine-n 1000 -kine-reps 1 -reps 1 -sweep=false -quota 25165824 -json ''

# Every fuzz target of the module, PACKAGE:FUNCTION: the one list (`make
# fuzz-targets` fails when a Fuzz function of a _test.go file is not in it).
# Their seed corpora (testdata/fuzz/) run with every `go test`.
FUZZ_TARGETS := \
	./snapshotdb:FuzzSnapshotFile \
	./encryption:FuzzLoad \
	./apiserverconfig:FuzzManifest \
	./apiserverconfig:FuzzFlagsFile \
	./installer:FuzzK3sConfiguration \
	./target:FuzzKubeadmConfig \
	./decode:FuzzDecode \
	./decode:FuzzEnvelopeTypeMeta \
	./customresource:FuzzDecode \
	./undo:FuzzJournal \
	./undo:FuzzRunRecords
# How long `make fuzz` fuzzes each target, and `make test` (CI's run).
FUZZ_TIME       ?= 30s
FUZZ_SHORT_TIME ?= 10s

fuzz-targets:
	@found=$$(grep -roE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sed -E 's|^(.*)/[^/]*_test\.go:func |\1:|'); bad=; \
	for t in $$found; do case " $(FUZZ_TARGETS) " in *" $$t "*) ;; *) echo "FUZZ_TARGETS lacks $$t"; bad=1;; esac; done; \
	for t in $(FUZZ_TARGETS); do echo "$$found" | grep -qxF "$$t" || { echo "FUZZ_TARGETS names $$t, which is no fuzz target"; bad=1; }; done; \
	test -z "$$bad"

# Each fuzz target for FUZZ_TIME (new inputs minimized briefly: a short run
# spends its time fuzzing). A failing input is written to the package's
# testdata/fuzz/ (commit it with the fix: it becomes a seed). Go's fuzzing
# coordinator may fail a target at the end of -fuzztime with a bare "context
# deadline exceeded" when a worker is mid-call on loaded cores, with no
# failing input (golang/go#75804): that target, and only then, is fuzzed
# once more; any other failure, or that one twice, fails.
fuzz: fuzz-targets
	@for t in $(FUZZ_TARGETS); do \
		for try in 1 2; do \
			echo "fuzz $${t%%:*} $${t#*:} for $(FUZZ_TIME)"; \
			out=$$($(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZ_TIME) -fuzzminimizetime 20x 2>&1); rc=$$?; \
			echo "$$out"; \
			test $$rc -eq 0 && break; \
			if test $$try -eq 1 && echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -qiE 'failing input|panic:|_test.go:[0-9]+:'; then \
				echo "fuzz: Go's coordinator stopped at -fuzztime with no failing input (golang/go#75804): once more"; continue; \
			fi; \
			exit 1; \
		done; \
	done

# BENCH_FLAGS adds flags, e.g. BENCH_FLAGS="-baseline OLD-BINARY" to measure
# another build beside this one in every repetition (docs/benchmarks.md).
# Then its figures: the results drawn as SVG charts into docs/figures
# (bench/figures, a module of its own).
bench:
	$(GO) run ./bench -n $(BENCH_N) -snapshot-n $(BENCH_SNAPSHOT_N) -rollback-n $(BENCH_ROLLBACK_N) -scale-n $(BENCH_SCALE_N) -kine-n $(BENCH_KINE_N) $(BENCH_FLAGS)
	$(MAKE) bench-figures

# The SVG charts of docs/benchmarks.md from the results files in bench/.
bench-figures:
	$(GO) -C bench/figures run . -in .. -out ../../docs/figures

# The incumbent beside the tool: the mixed dataset only, the apiserver path on
# 20,000 of its objects (about 3 minutes), figures in bench/results-apiserver.*.
bench-apiserver:
	$(GO) run ./bench -dataset mixed -n $(BENCH_N) -apiserver -apiserver-n 20000 -sweep=false -snapshot=false -json bench/results-apiserver.json

# The scale phase at production size: verify --snapshot-file on files of 1,000,000 and
# 4,000,000 mixed objects (about 1.8 and 7.4 GB; free disk for about 20 GB, and about
# 15 minutes on 2 cores), figures in bench/results-scale.*.
bench-scale:
	$(GO) run ./bench -dataset scale -scale-n 1000000 $(BENCH_FLAGS)

# The production rows (issues 28, 58): 4,000,000 mixed objects filling an 8 GiB quota:
# verify once, plan, migrate --compact-history, rollback of the whole journal and
# the compaction-matched ceiling in three rounds (each migrate beside its own
# ceiling), then verify --snapshot-file, migrate --output-snapshot and its restore;
# about 45 GB of free disk and 80 minutes on a quiet machine.
bench-production:
	$(GO) run ./bench -dataset production -production-n 4000000 -production-reps 3 $(BENCH_FLAGS)

clean:
	rm -rf bin $(DIST)
