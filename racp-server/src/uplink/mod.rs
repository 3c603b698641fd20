//! The host-gateway link's parts both sides run: the NATS servers and TLS a link dials
//! (`link.rs`), the host's key (`key.rs`), and the signed envelope of a routed call
//! (`signed.rs`).

pub mod key;
pub mod link;
pub mod signed;
