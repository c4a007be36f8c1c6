//! The applications built on the dataplane, each behind a feature of its own: the echo responder and the
//! paced UDP load generator and sink.

#[cfg(feature = "echo")]
pub mod echo;
#[cfg(feature = "load")]
pub mod load;
