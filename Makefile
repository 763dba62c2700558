# userproxy — make help lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(GOBIN)/staticcheck

.PHONY: help test unit lint tools bench-once darwin integration kube-apiserver kubeapi bench fuzz fuzz-short soak

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: lint unit bench-once fuzz-short darwin ## everything CI checks: lint, race tests (root-only ones too when root), every benchmark once, a short run of every fuzzer, darwin build

unit: ## go test -race ./... (integration tests run when root)
	$(GO) test -race -count=1 ./...

lint: tools ## gofmt (as a test), go vet, staticcheck
	$(GO) test -count=1 -run '^TestGofmt$$' .
	$(GO) vet ./...
	GOOS=darwin $(GO) vet ./...
	$(STATICCHECK) ./...

tools: ## install the pinned Go tools (staticcheck)
	@if ! $(STATICCHECK) -version 2>/dev/null | grep -q '$(STATICCHECK_VERSION:v%=%)'; then \
		echo "installing staticcheck $(STATICCHECK_VERSION)"; \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	fi

bench-once: ## run every benchmark once so they keep compiling and working
	$(GO) test -count=1 -run='^$$' -bench=. -benchtime=1x ./...

darwin: ## cross-compile for macOS
	GOOS=darwin GOARCH=arm64 $(GO) build ./...

integration: ## the root-only tests in integration/ (real TUN, namespaces)
	$(GO) test -race -count=1 -v ./integration/...

kube-apiserver: ## build kube-apiserver for the API server tests (once per version: 10-15 min, then cached)
	integration/kubeapiserver/build.sh

kubeapi: kube-apiserver ## the tests against a real etcd + kube-apiserver (etcd: apt-get install etcd-server)
	$(GO) test -race -count=1 -v ./integration/kubeapi/
	$(GO) test -race -count=1 -v -run '^TestBinaryKubeAPIServer$$' ./integration/

bench: ## the benchmarks with real figures (see BENCHMARKS.md); the datapath ones need root
	$(GO) test -run='^$$' -bench=. -benchmem -count=5 ./balancer/ ./conntrack/ ./service/
	$(GO) test -run='^$$' -bench=. -benchtime=2s ./integration/

FUZZTIME ?= 30s
fuzz: ## run each fuzzer for FUZZTIME (default 30s)
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -parallel=1 $$pkg || exit 1; \
		done; \
	done

soak: ## (root) 10 minutes of mixed traffic and endpoint churn; logs RSS, goroutines and flows over time
	USERPROXY_CHURN_DURATION=10m $(GO) test -count=1 -timeout 20m -run '^TestEndpointChurn$$' -v ./integration/

# A count, not a duration: Go 1.26's fuzzer can fail spuriously when a
# -fuzztime duration ends mid-run (golang/go#75804).
fuzz-short: ## run each fuzzer for 20000 inputs (CI)
	@$(MAKE) --no-print-directory fuzz FUZZTIME=20000x
