//! Redis harness (filled in by the Redis store work).
