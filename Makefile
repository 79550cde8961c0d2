# ratelimit-wasm: `make demo` shows it working, `make test` runs every test.
WASM := target/wasm32-wasip1/release/ratelimit_wasm.wasm
SHIM := target/shim/redis-shim

.PHONY: setup setup-demo build wasm shim native test test-wasm unit lint fmt fuzz up down demo clean

# Every tool in scripts/tools.txt; setup-demo leaves out what only the tests need, so that
# the first `make demo` does not wait for test tools to compile.
setup:
	@scripts/setup.sh

setup-demo:
	@scripts/setup.sh demo

# The filter and the shim side by side. The shim builds with the machine's toolchain, so
# its build (its crates' download first) starts at once, beside setup; the filter's waits
# for setup (Debian's toolchain, on a machine whose rustup has no wasm32 target). Their
# cargo target directories differ on that route; on rustup's, cargo's lock takes them one
# after the other. The shim's build yields to the filter's: the filter's is one chain of
# crates (std's among them), the shim's many crates fill whatever core it leaves idle.
build:
	@nice -n 19 $(MAKE) --no-print-directory shim & shim=$$!; \
	$(MAKE) --no-print-directory setup-demo && $(MAKE) --no-print-directory wasm; built=$$?; \
	wait $$shim && exit $$built

wasm:
	@scripts/build-wasm.sh

shim:
	@cargo build --quiet --profile shim -p redis-shim

# The filter as an Envoy dynamic module (docs/NATIVE.md): target/shim/libratelimit_native.so,
# built with the machine's toolchain and the shim's profile, so it reuses the shim's crates.
native:
	@cargo build --quiet --profile shim -p ratelimit-native

# Unit tests compiled to wasm32 under Node, then native unit tests and the end-to-end
# tests (real Redis, the real shim, real Envoy loading the built .wasm, and the built .so:
# tests/native.rs). The tests build
# with the shim's profile, so the shim's crates `make build` compiled serve them too. The
# previous release's build (for the version-skew test, the last to run) and then the fuzz
# targets' build start beside them and yield to them; the test waits for its build, and
# a build that failed in the background fails again in the foreground, with its message.
test: setup build native
	@nice -n 19 sh -c 'scripts/build-previous.sh; scripts/fuzz.sh build' >/dev/null 2>&1 & early=$$!; \
	scripts/test-wasm.sh && cargo test --profile shim --workspace --lib --tests; tested=$$?; \
	wait $$early; exit $$tested
	@scripts/fuzz.sh 3

test-wasm: setup
	@scripts/test-wasm.sh

unit:
	cargo test --workspace --lib --bins

# Every fuzz target for FUZZ_SECONDS each (make test runs them for 3 s).
FUZZ_SECONDS ?= 60
fuzz: setup
	@scripts/fuzz.sh $(FUZZ_SECONDS)

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

fmt:
	cargo fmt --all

# HOST=native: the demo stack with the filter as an Envoy dynamic module (envoy-native.yaml,
# docs/NATIVE.md) instead of the .wasm (envoy.yaml).
HOST ?= wasm
HOST_BUILD := $(if $(filter native,$(HOST)),native)
export HOST

up: build $(HOST_BUILD)
	@scripts/stack.sh up

down:
	@scripts/stack.sh down

# `make demo REGIONS=3`: instead, that many regions on this machine (scripts/regions-demo.py:
# a Redis and a shim each, 20 ms one way between them), no Envoy.
demo: build $(HOST_BUILD)
	@if [ -n "$(REGIONS)" ]; then \
		$(MAKE) --no-print-directory shim && python3 scripts/regions-demo.py --regions "$(REGIONS)"; \
	else \
		scripts/stack.sh up >/dev/null && \
		{ scripts/demo.sh || { scripts/stack.sh down; exit 1; }; } && \
		scripts/stack.sh down; \
	fi

# A release folder, dist/ratelimit-wasm-VERSION/ (scripts/dist.sh; REGISTRY names the
# registry the WasmPlugin pulls from).
.PHONY: dist
dist: build native
	@scripts/dist.sh

clean: down
	rm -rf target .run

# The demo stack in containers (docker-compose.yml): needs Docker with compose v2. The
# .wasm is built on the host and mounted into the official Envoy image.
.PHONY: compose-up compose-down

compose-up: wasm
	docker compose up --build --detach --wait

compose-down:
	docker compose down

# Benchmarks (not part of `make test`): Envoy with one worker on core 0, load from core 1;
# every configuration back to back, the sweep twice; see bench/RESULTS.md.
.PHONY: bench bench-regions
bench: setup build
	@PEER="$(PEER)" bench/bench.sh
# Three regions at 0, 10 and 40 ms one way: what each `regions` rung admits in a burst, its
# latency, replicated's convergence after a partition, Redis work per check (bench/regions.py).
bench-regions: shim
	@python3 bench/regions.py
