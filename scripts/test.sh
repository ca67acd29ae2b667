#!/usr/bin/env bash
# The project's whole test suite, from a fresh machine: installs what the tests need (Debian
# packages, rustup targets, scapy in a virtual environment, cargo-fuzz), then runs formatting,
# clippy, the workspace tests including the interop tests against scapy and tshark and the
# two-namespace tests (root: veth, nftables loss and ECN, tbf), the fuzz corpus replay, the
# bare-metal and aarch64 builds, the test suites under qemu-aarch64 (the UDP transport's loopback
# transfers included), a short fuzz campaign per target, and the README's main command.
#
# Usage: scripts/test.sh            (FUZZ_SECONDS=N sets each fuzz target's campaign length)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-20}

step() { printf '\n=== %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

step "Debian packages: tshark, qemu-user, the aarch64 cross toolchain, libibverbs, ip/tc/nft"
# Each package is decided by the exact file the build or the tests use, never by a glob or a command
# that another package also provides (libclang-cpp14, on a fresh Debian 12, matches libclang*.so*).
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
have() { compgen -G "$1" >/dev/null; }
need=()
{ have /usr/bin/ip || have /bin/ip; } && { have /usr/sbin/tc || have /sbin/tc; } || need+=(iproute2)
have /usr/sbin/nft || need+=(nftables)
# The locked-memory test drops CAP_IPC_LOCK and lowers RLIMIT_MEMLOCK for a child run.
have /usr/bin/setpriv && have /usr/bin/prlimit || need+=(util-linux)
# rdma-sys: pkg-config probes libibverbs.pc and librdmacm.pc, bindgen reads their headers through
# libclang (clang-sys looks for libclang.so; libclang-dev brings it with clang's own headers).
have "/usr/lib/$multiarch/pkgconfig/libibverbs.pc" && have /usr/include/infiniband/verbs.h || need+=(libibverbs-dev)
have "/usr/lib/$multiarch/pkgconfig/librdmacm.pc" && have /usr/include/rdma/rdma_cma.h || need+=(librdmacm-dev)
command -v pkg-config >/dev/null || need+=(pkgconf)
have '/usr/lib/llvm-*/lib/libclang.so' || need+=(libclang-dev)
have /usr/bin/tshark || need+=(tshark)
have /usr/bin/qemu-aarch64 || need+=(qemu-user)
# The cross linker, and the arm64 C library it links against and qemu-aarch64 -L loads.
have /usr/bin/aarch64-linux-gnu-gcc || need+=(gcc-aarch64-linux-gnu)
have /usr/aarch64-linux-gnu/lib/libc.so && have /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 \
  || need+=(libc6-dev-arm64-cross)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
tshark --version | head -1
qemu-aarch64 --version | head -1

step "Rust targets and components"
rustup target add aarch64-unknown-linux-gnu aarch64-unknown-none thumbv7em-none-eabihf >/dev/null
rustup component add rustfmt clippy >/dev/null

step "scapy in .venv"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install -q 'scapy==2.8.0'
.venv/bin/python -c 'import scapy; print("scapy", scapy.__version__)'
export METAROCE_PYTHON="$root/.venv/bin/python"

step "rustfmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p host-ibverbs -p metaroce-cli --features verbs --all-targets -- -D warnings
(cd fuzz && cargo fmt -- --check && cargo clippy --all-targets -- -D warnings)

step "workspace tests: interop with scapy and tshark, namespaces, the verbs backend (no device here)"
# rdma-sys's own generated layout tests are not run: only our packages' tests are.
cargo test --workspace --features host-ibverbs/verbs -- --include-ignored

step "fuzz corpora replayed on stable"
cargo test --manifest-path fuzz/Cargo.toml

step "transport-core for bare metal, with and without defmt and fast-crc"
for target in aarch64-unknown-none thumbv7em-none-eabihf; do
  for features in "" "--no-default-features" "--features defmt" "--no-default-features --features defmt"; do
    echo "build transport-core --target $target $features"
    cargo build -q -p transport-core --target "$target" $features
  done
  for features in "" "--features fast-crc" "--features defmt"; do
    echo "link .ci/nostd-link --target $target $features (no allocator, no_main)"
    cargo build -q --release --manifest-path .ci/nostd-link/Cargo.toml --target "$target" $features
  done
done

step "aarch64-unknown-linux-gnu (BlueField DPU Arm cores): build, then test under qemu-aarch64"
cargo build -q --workspace --target aarch64-unknown-linux-gnu
cargo test -p transport-core -p tests --target aarch64-unknown-linux-gnu -- --include-ignored
cargo test -p host-ibverbs --lib --target aarch64-unknown-linux-gnu

step "fuzz campaign, ${FUZZ_SECONDS}s per target (cargo-fuzz on stable with -s none)"
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked -q || echo "cargo-fuzz could not be installed: the campaign does not run (the corpus replay above still did)"
fi
if command -v cargo-fuzz >/dev/null; then
  crashes=0
  for t in frame mr_data mr_ack mr_nack mr_probe conn_pair; do
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$t/." "$work/"
    status=0
    (cd fuzz && cargo fuzz run "$t" "$work" -s none -- -max_total_time="$FUZZ_SECONDS" >"$work.log" 2>&1) || status=$?
    n=$(find "fuzz/artifacts/$t" -type f 2>/dev/null | wc -l)
    runs=$(grep -oE 'Done [0-9]+ runs' "$work.log" | tail -1 || true)
    echo "fuzz $t: ${runs:-no summary}, exit $status, crashes $n"
    [ "$status" = 0 ] || tail -20 "$work.log"
    crashes=$((crashes + n))
    [ "$status" = 0 ] || [ "$n" -gt 0 ] || crashes=$((crashes + 1))
    rm -rf "$work" "$work.log"
  done
  echo "fuzz crashes: $crashes"
  [ "$crashes" = 0 ]
fi

step "the README's main command: a loopback bandwidth and latency run over the UDP transport"
cargo run -q --release --bin metaroce -- loopback

step "gen piped into decode, every ICRC checked"
cargo run -q --release -p metaroce-cli --bin metaroce -- gen --count 1000 --seed 1 \
  | cargo run -q --release -p metaroce-cli --bin metaroce -- decode --json \
  | .venv/bin/python -c 'import json,sys; f=[json.loads(l) for l in sys.stdin]; bad=[x for x in f if "error" in x or not x["icrc"]["ok"]]; print(len(f), "frames decoded,", len(bad), "bad"); sys.exit(1 if bad or len(f) != 1000 else 0)'

step "all tests passed"
