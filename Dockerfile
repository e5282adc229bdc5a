# The Ballast image: the `ballast` binary (engine, operator, bench, local) on a minimal glibc
# base, run as user 65532, with no shell. docs/image.md explains every stage, argument and
# error message; docs/install.md has the walk-through.
#
#   docker build -t ballast:0.1.0 .                     from source (the default target)
#   docker build --target prebuilt -t ballast:0.1.0 DIR   DIR holds only a built `ballast`
#   docker build --target debuginfo --output type=local,dest=OUT .   the symbols, as OUT/ballast.debug
#
# podman build and buildah bud take the same arguments.
#
# Build arguments (the bases are arguments so that an offline build can name local images):
#   RUST_IMAGE     base of the build stage: a Rust toolchain (1.89 or newer) with gcc and
#                  binutils (strip, objcopy), as the official rust images have
#   RUNTIME_IMAGE  base of the image: glibc 2.34 or newer and libgcc_s, nothing else needed
#   VERSION        the org.opencontainers.image.version label
#   STRIP          all (default): no symbols; debug: keep symbol names (function names in
#                  backtraces, about 7 MB more); none: keep the line tables too (file:line
#                  in backtraces, about 150 MB more)

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# ---- build: the release binary from this source tree -------------------------------------
# An empty base argument would otherwise fail with "no FROM statement found"; these names
# say which argument it was.
FROM ${RUST_IMAGE:-build-arg-rust-image-is-empty} AS build
ARG STRIP=all
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit, podman, buildah), so a
# rebuild after an edit recompiles only what changed; the binary is copied out of the cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eu; \
    case "$STRIP" in all|debug|none) ;; \
      *) echo "build argument STRIP must be all, debug or none, not '$STRIP'" >&2; exit 2 ;; \
    esac; \
    cargo build --release --locked -p ballast; \
    mkdir -p /out; \
    cp target/release/ballast /out/ballast; \
    objcopy --only-keep-debug /out/ballast /out/ballast.debug; \
    case "$STRIP" in \
      all) strip --strip-all /out/ballast ;; \
      debug) strip --strip-debug /out/ballast ;; \
    esac; \
    if [ "$STRIP" != none ]; then objcopy --add-gnu-debuglink=/out/ballast.debug /out/ballast; fi

# ---- debuginfo: the unstripped binary's symbols and line tables, to export with --output --
FROM scratch AS debuginfo
COPY --from=build /out/ballast.debug /ballast.debug

# ---- runtime: what both images share (no binary yet) -------------------------------------
FROM ${RUNTIME_IMAGE:-build-arg-runtime-image-is-empty} AS runtime
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ballast" \
      org.opencontainers.image.description="Ballast: an LLM inference engine with an OpenAI-compatible API, and the Kubernetes operator that scales its fleets" \
      org.opencontainers.image.source="https://github.com/ballast-dev/ballast" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
ENTRYPOINT ["ballast"]

# ---- prebuilt: a binary built outside, from the root of the build context ----------------
# The context needs nothing else: `mkdir ctx && strip -o ctx/ballast target/release/ballast`.
FROM runtime AS prebuilt
COPY --chown=0:0 --chmod=0755 ballast /usr/local/bin/ballast
# Exec form, as user 65532: fails the build when this base cannot run the binary (no glibc,
# a glibc older than 2.34, another architecture) rather than at the first pod start.
RUN ["ballast", "--version"]

# ---- image (the default target): the binary built by the build stage --------------------
FROM runtime AS image
COPY --from=build --chown=0:0 --chmod=0755 /out/ballast /usr/local/bin/ballast
RUN ["ballast", "--version"]
