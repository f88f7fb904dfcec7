//! strata wire types: RESP command shapes, memory descriptors and error codes.
//!
//! Pure codecs only: no sockets, no clocks, no async runtime. Everything here
//! must be callable from a fuzz target.

pub mod desc;
