# Build: a release binary with the migrations and defaults compiled in.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY config ./config
COPY assets ./assets
COPY benches ./benches
RUN cargo build --release --locked --bin daylog

# Run: a small image, a non-root user, the database in a volume.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app daylog \
    && mkdir -p /app/data && chown daylog /app/data
COPY --from=build /src/target/release/daylog /usr/local/bin/daylog
# The example configs, so that DAYLOG_CONFIG=config/examples/… works as documented.
COPY config/examples /app/config/examples
WORKDIR /app
USER daylog
ENV DATABASE_URL=sqlite:///app/data/daylog.db RUST_LOG=info
VOLUME ["/app/data"]
ENTRYPOINT ["daylog"]
CMD ["run"]
