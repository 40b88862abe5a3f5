//! Why a timer operation failed: an HTTP status and its reason, what
//! `api` answers with. A leaf of `shard`: the operations, the mesh's
//! replies and the resync all name it, and it names none of them.

/// Why a timer operation failed: an HTTP status and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub status: u16,
    pub reason: String,
}

impl OpError {
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        OpError {
            status,
            reason: reason.into(),
        }
    }
}
