//! Why a request failed: [`RequestError`], what a caller is told (whether
//! the request reached the wire, waited out, was withdrawn or refused),
//! and `Failure`, what a lane hands a queued request that got no status.
//! Plain data: no I/O here.

/// Why a queued request got no status.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// On the wire, and no answer came (or the connection failed).
    Sent(String),
    /// Withdrawn unsent: the callback was no longer wanted.
    Withdrawn,
}

/// Why a request failed, and whether it reached the wire (`sent: false`:
/// the target never saw it, so it may be handed elsewhere).
#[derive(Debug)]
pub struct RequestError {
    pub sent: bool,
    /// Not sent because no connection came free within the caller's wait.
    pub waited_out: bool,
    /// Not sent because it was no longer wanted (its timer was deleted or
    /// replaced while it waited).
    pub withdrawn: bool,
    /// Not sent because the callback guard (`[timers] callback-allow`)
    /// refuses the address its host resolved to now.
    pub refused: bool,
    pub reason: String,
}

impl RequestError {
    pub(super) fn unsent(reason: String) -> RequestError {
        RequestError {
            sent: false,
            waited_out: false,
            withdrawn: false,
            refused: false,
            reason,
        }
    }

    pub(super) fn sent(reason: String) -> RequestError {
        RequestError {
            sent: true,
            ..RequestError::unsent(reason)
        }
    }

    pub(super) fn of(failure: Failure) -> RequestError {
        match failure {
            Failure::Sent(reason) => RequestError::sent(reason),
            Failure::Withdrawn => RequestError {
                withdrawn: true,
                ..RequestError::unsent("withdrawn: its timer was deleted or replaced".to_string())
            },
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}
