# The README's two commands: `make bench` (the main job: a quick turbotun bench) and `make test` (every test).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps test lint unit bench bench-full build clean-netns

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release -p turbotun-cli

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	# The dataplane alone, as an embedding program without features builds it.
	$(CARGO) clippy -p turbotun --lib -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --all-features --no-deps --quiet

# Every test that cannot run here (no root, a kernel feature or tool missing) adds a line to this log (the skip
# rule in crates/turbotun/tests/common/skip.rs); the summary counts them and fails the run if there are any.
SKIPPED_LOG := $(CURDIR)/target/skipped-tests.log

unit:
	@mkdir -p $(dir $(SKIPPED_LOG)) && rm -f $(SKIPPED_LOG)
	TURBOTUN_SKIPPED_LOG=$(SKIPPED_LOG) $(CARGO) test --workspace --all-features
	@scripts/test-summary.sh $(SKIPPED_LOG)

# Everything CI runs: formatting, lints, unit/property/corpus tests and the privileged device tests; fails when a
# test could not run (see `unit`).
test: deps lint unit
	@scripts/check-leftovers.sh

# The main job: build, then a quick side-by-side bench (a few minutes, peers built on first use).
bench: build
	target/release/turbotun bench --quick

# A full run (all modes, 3 interleaved repetitions) with JSON, chart and table into bench-out/.
bench-full: build
	mkdir -p bench-out
	target/release/turbotun bench --reps 3 --json bench-out/bench.json --chart bench-out/bench.svg | tee bench-out/bench.md
