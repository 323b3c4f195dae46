# kiln's developer targets. `make test` is what CI runs (.ci/run).

VERSITYGW_VERSION ?= v1.8.0
GOBIN := $(shell go env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: test test-deps build vet fmt bench

## test: install the test services when missing, then run every test.
test: test-deps
	go test -timeout 45m ./...

## test-deps: redis-server (Debian package) and versitygw (S3 server), pinned.
test-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v versitygw >/dev/null 2>&1 || { \
		echo "installing versitygw $(VERSITYGW_VERSION) (go install)"; \
		go install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION); }

## build: the one binary, without cgo.
build:
	CGO_ENABLED=0 go build -o bin/sched ./cmd/sched

vet:
	go vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

bench:
	go test -run '^$$' -bench . -benchmem ./...
