# syntax=docker/dockerfile:1
# Build: docker build -t slidegate .
# Run:   docker run -p 8080:8080 -p 9090:9090 -e SLIDEGATE_UPSTREAM=app:3000 \
#          -e SLIDEGATE_REDIS_URL=redis://redis:6379/0 -e SLIDEGATE_ADMIN_TOKEN=... slidegate
# (the default config, deploy/image/slidegate.toml, reads those variables; or mount your own
# over /etc/slidegate/slidegate.toml). The release profile strips the binary (Cargo.toml).

# Base images pinned to exact releases, so a rebuild gets the same toolchain and libc as the one
# tested: rust 1.95.0 is Cargo.toml's rust-version, and Debian 12.11 the point release the
# runtime was checked on. Bump them deliberately (and add an @sha256 digest where your registry
# mirror allows resolving one: a tag can still be re-pushed, a digest cannot).
FROM rust:1.95.0-bookworm AS builder
WORKDIR /src
# Dependencies first, so source edits don't rebuild them.
COPY Cargo.toml Cargo.lock ./
# Pingora's HTTP proxy with one patch (vendor/README.md), a path dependency.
COPY vendor vendor
# Profile-guided optimisation: the committed profile (pgo/profile.txt says what it was trained
# with; scripts/pgo trains a fresh one). It fits only this rustc (the tag above: bump both
# together) and a build with an explicit --target, as scripts/pgo's. On another architecture
# nothing in it matches and the build is a plain release build.
COPY pgo/slidegate.profdata pgo/
ENV RUSTFLAGS="-Cprofile-use=/src/pgo/slidegate.profdata"
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && cargo build --release --locked --target "$(rustc -vV | sed -n 's/^host: //p')" && rm -rf src
COPY src src
# build.rs assembles the Redis scripts from lua/ (lua/<script>/skeleton.lua, lua/kinds/).
COPY build.rs ./
COPY lua lua
RUN host="$(rustc -vV | sed -n 's/^host: //p')" && touch src/main.rs src/lib.rs \
 && cargo build --release --locked --target "$host" \
 && cp "target/$host/release/slidegate" /src/slidegate

FROM debian:12.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin slidegate
COPY --from=builder /src/slidegate /usr/local/bin/slidegate
COPY deploy/image/slidegate.toml /etc/slidegate/slidegate.toml
USER slidegate
EXPOSE 8080 9090
STOPSIGNAL SIGTERM
# No curl in the image: the binary probes its own /healthz over loopback (exit 0 on 200).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/slidegate", "healthcheck", "--config", "/etc/slidegate/slidegate.toml"]
ENTRYPOINT ["/usr/local/bin/slidegate"]
CMD ["--config", "/etc/slidegate/slidegate.toml"]
