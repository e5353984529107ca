# kube-etcd-migrate. `make demo` and `make test` are the two commands a newcomer needs.
GO            ?= go
BIN           := bin/kube-etcd-migrate
TOOLS         := $(CURDIR)/bin/tools
STATICCHECK   := $(TOOLS)/staticcheck
STATICCHECK_VERSION := v0.8.2
# The whole suite, e2e against a real kube-apiserver included, on a 2-core machine.
TEST_TIMEOUT  ?= 75m
BENCH_N       ?= 100000

.PHONY: build demo test lint unit fuzz bench bench-apiserver clean

build:
	$(GO) build -o $(BIN) .

demo:
	$(GO) run ./cmd/demo

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

# Every test, including the end-to-end tests that start kube-apiserver in-process.
test: lint
	$(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./...

# Short fuzzing of the decoders (the seed corpora already run in `make test`).
fuzz:
	$(GO) test ./decode/ -run '^$$' -fuzz FuzzDecode -fuzztime 60s
	$(GO) test ./customresource/ -run '^$$' -fuzz FuzzDecode -fuzztime 60s

bench:
	$(GO) run ./bench -n $(BENCH_N)

bench-apiserver:
	$(GO) run ./bench -n $(BENCH_N) -apiserver

clean:
	rm -rf bin
