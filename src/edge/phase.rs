//! Where a client connection is in its life, as one `AtomicU8` the edge stream shares between
//! its read side (which moves it) and the head deadline and refusal log (which read it). Its
//! own file so those readers depend on it, not on each other.

/// Waiting for (the rest of) a request head.
pub(super) const PHASE_HEAD: u8 = 0;
/// A head was parsed; the request is being handled.
pub(super) const PHASE_REQUEST: u8 = 1;
/// Between requests on a keep-alive connection.
pub(super) const PHASE_IDLE: u8 = 2;
/// Reading a request body.
pub(super) const PHASE_BODY: u8 = 3;
/// An HTTP/2 connection (its own timeouts apply).
pub(super) const PHASE_H2: u8 = 4;
