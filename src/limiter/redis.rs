//! Redis store (placeholder until the Redis store lands).
