//! DRAM tier: the node's pre-allocated arena ([`Arena`]) and the pure offset
//! allocator that carves it into chunks ([`SlabAllocator`]).
//!
//! The allocator never touches memory and the arena never decides placement;
//! the DRAM tier glues the two together.

mod alloc;
mod arena;

pub use alloc::{Chunk, SlabAllocator};
pub use arena::Arena;
