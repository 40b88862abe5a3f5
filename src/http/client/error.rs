//! Why a request failed: [`RequestError`], what a caller is told (whether
//! the request reached the wire, waited out, was withdrawn or refused,
//! and how the attempt ended for the retries: its [`Outcome`]), and
//! `Failure`, what a lane hands a queued request that got no status.
//! Plain data: no I/O here.

use crate::timer::retry::Outcome;

/// Why an exchange got no (full) answer, and which outcome that is: the
/// client's timeout passed ([`Outcome::Timeout`]), or the connection
/// failed or the answer was malformed ([`Outcome::Transport`]).
#[derive(Clone, Debug)]
pub(super) struct Broken {
    pub(super) reason: String,
    pub(super) outcome: Outcome,
}

impl Broken {
    pub(super) fn transport(reason: String) -> Broken {
        Broken {
            reason,
            outcome: Outcome::Transport,
        }
    }

    pub(super) fn timeout(reason: String) -> Broken {
        Broken {
            reason,
            outcome: Outcome::Timeout,
        }
    }
}

/// Why a queued request got no status.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// On the wire, and no answer came (or the connection failed).
    Sent(Broken),
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
    /// How the attempt ended, for the retries (`Outcome::class`):
    /// `Transport` (the connection failed or was reset, TLS failed, the
    /// answer was malformed or cut short; and, with `sent: false`, the
    /// name did not resolve, or the target has just failed and enough
    /// requests wait for it already), `Timeout` (no answer within the
    /// client's timeout), or `Status` (a non-2xx answer, with its
    /// `Retry-After`). `None` when the target was not tried at all: the
    /// guard refused it, the caller's wait ran out, it was withdrawn, or
    /// its URI did not parse.
    pub outcome: Option<Outcome>,
}

impl RequestError {
    pub(super) fn unsent(reason: String) -> RequestError {
        RequestError {
            sent: false,
            waited_out: false,
            withdrawn: false,
            refused: false,
            reason,
            outcome: None,
        }
    }

    /// Not sent, because the target cannot be reached now: as a failed
    /// connection for the retries.
    pub(super) fn unreached(reason: String) -> RequestError {
        RequestError {
            outcome: Some(Outcome::Transport),
            ..RequestError::unsent(reason)
        }
    }

    pub(super) fn sent(broken: Broken) -> RequestError {
        RequestError {
            sent: true,
            outcome: Some(broken.outcome),
            ..RequestError::unsent(broken.reason)
        }
    }

    /// The target answered `status`, not a 2xx.
    pub(super) fn answered(what: &str, status: u16, retry_after_ms: Option<u64>) -> RequestError {
        RequestError {
            sent: true,
            outcome: Some(Outcome::Status {
                code: status,
                retry_after_ms,
            }),
            ..RequestError::unsent(format!("{what} answered {status}"))
        }
    }

    pub(super) fn of(failure: Failure) -> RequestError {
        match failure {
            Failure::Sent(broken) => RequestError::sent(broken),
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
