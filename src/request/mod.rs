//! What a request says, read before and while it is routed, in the order the proxy
//! reads it: its form (method, target, Host, length), its path, the method an app may
//! read it as, its id, the forwarding fields sent upstream, and its cost; and what slidegate
//! adds to it (`additions`: which forwarding fields, whether an id).

pub mod additions;
pub mod cost;
pub mod form;
pub mod forwarding;
pub mod id;
pub mod method_override;
pub mod path;
