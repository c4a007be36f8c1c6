# The README's two commands: `make bench` (the main job: a quick turbotun bench) and `make test` (every test).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps peers guest test lint unit bench bench-full build clean-netns install install-wg-quick uninstall

# Where `make install` puts things: $(DESTDIR)$(PREFIX)/bin, .../share/man/man1, the shells' completion folders.
PREFIX ?= /usr/local
DESTDIR ?=
# The binaries to install: what `make build` (or `cargo build --release -p turbotun-cli`) made.
BIN_DIR ?= target/release
BINDIR = $(DESTDIR)$(PREFIX)/bin
MANDIR = $(DESTDIR)$(PREFIX)/share/man/man1
SYSTEMD_DIR = $(DESTDIR)$(PREFIX)/lib/systemd/system

deps:
	@scripts/install-deps.sh

# The peers the tests run against: the WireGuard programs (wireguard-go, boringtun, GotaTun) and the forwarders
# of tun-rs and of wireguard-go's tun package (the bench's ×tun-rs rows, run by the smoke test), built from their
# published sources at the versions bench/peers/build.sh pins; skipped when already built. Built here, before the
# tests, so that no test waits for a build while the others run.
peers:
	bench/peers/build.sh tunrs wggo wireguard-go boringtun gotatun

# The small Linux guest (Debian's kernel, a busybox initramfs) that the QEMU vhost-user test boots, made into
# target/guest by scripts/guest-image.sh; nothing to do when it is there. Made here for the same reason as `peers`.
guest:
	scripts/guest-image.sh target/guest

build: deps
	$(CARGO) build --release -p turbotun-cli

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	# The dataplane alone, as an embedding program without features builds it.
	$(CARGO) clippy -p turbotun --lib -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --all-features --no-deps --quiet
	# One path per module inside the library, and no import cycle between its folders.
	scripts/check-imports.py
	# Files of at most 800 lines, no too_many_arguments allowance, BENCHMARKS.md of at most 350 lines.
	scripts/check-shape.sh

# Every test that cannot run here (no root, a kernel feature or tool missing) adds a line to this log (the skip
# rule in crates/turbotun/tests/common/skip.rs); the summary counts them and fails the run if there are any.
SKIPPED_LOG := $(CURDIR)/target/skipped-tests.log
# A CPU with AVX-512 must get IPsec-MB's ChaCha20-Poly1305 (install-deps installs the library): its tests may not
# pass on ring's alone there.
EXPECT_IPSEC_MB := $(shell grep -qw avx512f /proc/cpuinfo && echo 1)

unit: peers guest
	@mkdir -p $(dir $(SKIPPED_LOG)) && rm -f $(SKIPPED_LOG)
	TURBOTUN_EXPECT_IPSEC_MB=$(EXPECT_IPSEC_MB) TURBOTUN_SKIPPED_LOG=$(SKIPPED_LOG) $(CARGO) test --workspace --all-features
	# The wire crate's benches once each, as tests: their checks that both sides of a comparison (turbotun's and
	# tun-rs's GSO/GRO) produce the same bytes run here, not only under `cargo bench`.
	$(CARGO) test -p turbotun-wire --benches
	# The attacks on the WireGuard server again, with wireguard-go (the oracle) as the server: the tests themselves
	# are checked against the implementation they are meant to agree with.
	WG_TRUST_SERVER=wireguard-go TURBOTUN_SKIPPED_LOG=$(SKIPPED_LOG) $(CARGO) test -p turbotun-cli --all-features \
		--test wg_trust -- forged_handshake_messages unauthenticated_datagrams_never an_initiation_replayed \
		no_other_socket_joins
	# The protocol again on ring's ChaCha20-Poly1305 (`TURBOTUN_AEAD=ring`: what a CPU without AVX-512 runs), its
	# unit tests and the interoperation with wireguard-go and with WireGuard's netns selftest.
	TURBOTUN_AEAD=ring $(CARGO) test -p turbotun-wg --all-features
	TURBOTUN_AEAD=ring TURBOTUN_SKIPPED_LOG=$(SKIPPED_LOG) $(CARGO) test -p turbotun-cli --all-features --test wg -- \
		turbotun_wg_and_wireguard_go_interoperate_both_ways wireguard_gos_netns_selftest_passes_against_turbotun_wg
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

# Installs both programs, their manual pages and completions for bash, zsh and fish. Builds nothing: build first as
# yourself (make build), then install as root, so that no build runs as root.
install:
	@test -x $(BIN_DIR)/turbotun -a -x $(BIN_DIR)/turbotun-wg || \
		{ echo "make install: no $(BIN_DIR)/turbotun and turbotun-wg: run make build first" >&2; exit 1; }
	install -d $(BINDIR) $(MANDIR) $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0755 $(BIN_DIR)/turbotun $(BIN_DIR)/turbotun-wg $(BINDIR)/
	$(BIN_DIR)/turbotun man $(MANDIR) >/dev/null
	$(BIN_DIR)/turbotun completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/turbotun
	$(BIN_DIR)/turbotun completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_turbotun
	$(BIN_DIR)/turbotun completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/turbotun.fish
	$(BIN_DIR)/turbotun completions bash --program turbotun-wg > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/turbotun-wg
	$(BIN_DIR)/turbotun completions zsh --program turbotun-wg > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_turbotun-wg
	$(BIN_DIR)/turbotun completions fish --program turbotun-wg > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/turbotun-wg.fish

# Opt-in: every wg-quick@NAME.service runs turbotun-wg where the kernel has no WireGuard (a systemd drop-in).
install-wg-quick:
	install -d $(SYSTEMD_DIR)/wg-quick@.service.d
	sed 's|@BINDIR@|$(PREFIX)/bin|' deploy/systemd/wg-quick@.service.d/turbotun.conf.in \
		> $(SYSTEMD_DIR)/wg-quick@.service.d/turbotun.conf

uninstall:
	rm -f $(BINDIR)/turbotun $(BINDIR)/turbotun-wg $(MANDIR)/turbotun.1 $(MANDIR)/turbotun-*.1 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/turbotun \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_turbotun \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/turbotun.fish \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/turbotun-wg \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_turbotun-wg \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/turbotun-wg.fish \
		$(SYSTEMD_DIR)/wg-quick@.service.d/turbotun.conf
