# userproxy — make help lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(GOBIN)/staticcheck

.PHONY: help test unit lint tools bench-once darwin integration faults kube-apiserver kubeapi bench bench-harness fuzz fuzz-short soak image

# The image (Containerfile): IMAGE names it, VERSION is stamped into the
# binary (userproxy version) and labels it, BUILDAH is the command that builds
# it (vfs storage and chroot isolation need no overlay, fuse or runtime).
IMAGE ?= localhost/userproxy:latest
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILDAH ?= buildah --storage-driver vfs
IMAGE_CONTEXT ?= bin/image

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: lint unit bench-once fuzz-short darwin ## everything CI checks: lint, race tests (root-only ones too when root), every benchmark once, a short run of every fuzzer, darwin build

# The packages under integration/ (real TUNs, the real binary, kube-apiserver,
# the bench harness) run one at a time, so that none is judged while another
# loads the machine's cores; the others run in parallel.
unit: ## go test -race ./... (integration tests run when root; the TUN suite three times: then with --tcp-translate=false, gVisor's TCP, then with --tun-portable, macOS's device path)
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /integration)
	$(GO) test -race -count=1 -p 1 -timeout 45m ./integration/...
	USERPROXY_TCP_TRANSLATE=0 $(GO) test -race -count=1 -timeout 45m ./integration/
	USERPROXY_TUN=portable $(GO) test -race -count=1 -timeout 45m ./integration/

lint: tools ## gofmt (as a test), go vet (also for darwin and linux/arm64), staticcheck
	$(GO) test -count=1 -run '^TestGofmt$$' .
	$(GO) vet ./...
	GOOS=darwin $(GO) vet ./...
	GOARCH=arm64 $(GO) vet ./...
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

# Without -race, so that the logged goodput table means something; the
# short form of the same test runs in `unit`. USERPROXY_FAULTS_PATHS picks
# paths, USERPROXY_FAULTS_TRACE traces the wire (integration/faults_linux_test.go).
faults: ## (root) TestFaults in full: every fault profile, 16 MiB each way, a 60 s link-down; the kernel path, translated TCP and gVisor's side by side
	USERPROXY_FAULTS=full $(GO) test -count=1 -p 1 -timeout 120m -run '^TestFaults$$' -v ./integration/

kube-apiserver: ## build kube-apiserver for the API server tests (once per version: 10-15 min, then cached)
	integration/kubeapiserver/build.sh

kubeapi: kube-apiserver ## the tests against a real etcd + kube-apiserver (etcd: apt-get install etcd-server)
	$(GO) test -race -count=1 -v ./integration/kubeapi/
	$(GO) test -race -count=1 -v -run '^TestBinaryKubeAPIServer$$' ./integration/

bench: ## the benchmarks with real figures (see BENCHMARKS.md); the datapath ones need root
	$(GO) test -run='^$$' -bench=. -benchmem -count=5 ./balancer/ ./conntrack/ ./service/
	$(GO) test -run='^$$' -bench=. -benchtime=2s ./integration/

bench-harness: ## (root) side by side: direct veth, kernel iptables, the userspace peers (pasta, tun2socks), userproxy on a TUN; prints BENCHMARKS.md's tables
	$(GO) run ./integration/bench $(BENCH_FLAGS)

# With a duration, Go 1.26's fuzzer can end a clean run with "context
# deadline exceeded" and no failing input (golang/go#75804; see fuzz-short): a
# run whose report ends exactly so (that line fourth from the end, before
# FAIL, "exit status 1" and the package's FAIL) and that wrote no input to
# testdata/fuzz is reported and passed over. Any other failure, a package
# whose fuzzers cannot be listed included, stops the loop.
FUZZTIME ?= 30s
fuzz: ## run each fuzzer for FUZZTIME (default 30s)
	@log=$$(mktemp); trap 'rm -f $$log $$log.rc' EXIT; \
	for pkg in $$($(GO) list ./...); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		fs=$$($(GO) test -list '^Fuzz' $$pkg) || { echo "$$fs"; exit 1; }; \
		for f in $$(echo "$$fs" | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; \
			before=$$(ls $$dir/testdata/fuzz/$$f 2>/dev/null | wc -l); \
			{ $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -parallel=1 $$pkg; echo $$? > $$log.rc; } 2>&1 | tee $$log; \
			[ "$$(cat $$log.rc)" = 0 ] && continue; \
			after=$$(ls $$dir/testdata/fuzz/$$f 2>/dev/null | wc -l); \
			if [ "$$after" = "$$before" ] && [ "$$(tail -n 4 $$log | head -n 1)" = "    context deadline exceeded" ]; then \
				echo "== $$f: no failing input written; Go's fuzzing deadline race (golang/go#75804), passed over"; \
			else exit 1; fi; \
		done; \
	done

soak: ## (root) 10 minutes of mixed traffic and endpoint churn; logs RSS, goroutines and flows over time
	USERPROXY_CHURN_DURATION=10m $(GO) test -count=1 -timeout 20m -run '^TestEndpointChurn$$' -v ./integration/

image: ## (root) the container image with buildah: the static binary, FROM scratch, run as 65532 with cap_net_admin
	@if [ "$$(id -u)" != 0 ]; then echo "make image needs root (setcap, and buildah's storage)" >&2; exit 1; fi
	@command -v buildah >/dev/null || { echo "make image needs buildah (apt-get install buildah)" >&2; exit 1; }
	@PATH="$$PATH:/usr/sbin:/sbin" command -v setcap >/dev/null || { echo "make image needs setcap (apt-get install libcap2-bin)" >&2; exit 1; }
	rm -rf $(IMAGE_CONTEXT)/rootfs
	mkdir -p $(IMAGE_CONTEXT)/rootfs/usr/local/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(VERSION)' -o $(IMAGE_CONTEXT)/rootfs/userproxy ./cmd/userproxy
	PATH="$$PATH:/usr/sbin:/sbin" setcap cap_net_admin=ep $(IMAGE_CONTEXT)/rootfs/userproxy
	ln -f $(IMAGE_CONTEXT)/rootfs/userproxy $(IMAGE_CONTEXT)/rootfs/usr/local/bin/kube-proxy
	cp Containerfile $(IMAGE_CONTEXT)/Containerfile
	$(BUILDAH) bud --isolation chroot --layers=false \
		--label org.opencontainers.image.version=$(VERSION) \
		-f $(IMAGE_CONTEXT)/Containerfile -t $(IMAGE) $(IMAGE_CONTEXT)

# A count, not a duration: Go 1.26's fuzzer can fail spuriously when a
# -fuzztime duration ends mid-run (golang/go#75804).
fuzz-short: ## run each fuzzer for 20000 inputs (CI)
	@$(MAKE) --no-print-directory fuzz FUZZTIME=20000x
