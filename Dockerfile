# syntax=docker/dockerfile:1
# Build: docker build -t slidegate .
# Run:   docker run -p 8080:8080 -p 9090:9090 -v $PWD/config:/etc/slidegate:ro slidegate
# (in the mounted config, set admin_listen = "0.0.0.0:9090" to scrape from outside the container)

FROM rust:1-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source edits don't rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && cargo build --release --locked && rm -rf src
COPY src src
COPY lua lua
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin slidegate
COPY --from=builder /src/target/release/slidegate /usr/local/bin/slidegate
COPY config/slidegate.toml /etc/slidegate/slidegate.toml
USER slidegate
EXPOSE 8080 9090
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/slidegate"]
CMD ["--config", "/etc/slidegate/slidegate.toml"]
