//! The conflict rules between a stored incarnation of a timer and one that
//! arrives from another node (seed 000's rules, extended for reloads):
//!
//! 1. **Version.** The newer client operation (version) wins, whatever
//!    view either copy was made under: a client's change taken by a node
//!    that has not reloaded yet is still the newest change (issue 37: a
//!    rolling reload threw such deletes away).
//! 2. **View.** Between copies of one version, a copy of the current
//!    cluster view beats one of a view this shard held before (a resync's
//!    copy or tombstone replaces the old-view copy it moved). A view it
//!    never held may be newer (a peer reloaded first), so it is not judged
//!    by view: the next rules decide.
//! 3. **Sequence.** Of the same version, the one with more pops done wins.
//! 4. **Tombstone.** At a tie, a tombstone beats a live copy.
//!
//! A client operation on this node always wins. A peer's re-send after
//! its start (`reliability.only-newer`) must also be of a newer version
//! ([`Source::PeerIfNewer`]).

use crate::timer::TimerHead;

/// Where an incoming change comes from, and so which rules it passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A client of this node: always applied.
    Client,
    /// Another node (replication, resync) or site: [`replaces`].
    Peer,
    /// A peer's re-send after its start (`shard/resend.rs`): a newer
    /// version, and then [`replaces`]. It may carry a state never meant to
    /// leave that node (a pop left to the next replica, a resync's
    /// tombstone for a node no longer a replica), which would win here by
    /// sequence or as a tombstone at a tie and stop a pop; the client
    /// change it exists to carry is newer than any copy that missed it.
    PeerIfNewer,
}

/// Whether `new` from `source` replaces `old` (stored here); see
/// [`replaces`] for `current` and `past`.
pub fn admits(
    source: Source,
    (new, new_tomb): (&TimerHead, bool),
    (old, old_tomb): (&TimerHead, bool),
    current: u32,
    past: &[u32],
) -> bool {
    match source {
        Source::Client => true,
        Source::Peer => replaces(new, new_tomb, old, old_tomb, current, past),
        Source::PeerIfNewer => {
            new.version > old.version && replaces(new, new_tomb, old, old_tomb, current, past)
        }
    }
}

/// Whether `new` (from another node) replaces `old` (stored here).
/// `current` is this shard's view fingerprint, `past` the views it held
/// before (`0` entries are empty).
pub fn replaces(
    new: &TimerHead,
    new_tomb: bool,
    old: &TimerHead,
    old_tomb: bool,
    current: u32,
    past: &[u32],
) -> bool {
    assert_eq!(
        new.id.unique, old.id.unique,
        "two incarnations of one timer"
    );
    if new.version != old.version {
        return new.version > old.version;
    }
    if new.view != old.view {
        if new.view == current {
            return true;
        }
        // Within a version the current view beats an older one; a view
        // this shard never held may be newer, and falls through to
        // sequence, so a pop replicated in the window between two nodes'
        // reloads is not popped again.
        if old.view == current && (new.view == 0 || past.contains(&new.view)) {
            return false;
        }
    }
    if new.sequence != old.sequence {
        return new.sequence > old.sequence;
    }
    new_tomb && !old_tomb
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::TimerId;

    fn head(view: u32, version: u64, sequence: u32) -> TimerHead {
        TimerHead {
            id: TimerId {
                unique: 7,
                bloom: 1,
            },
            start_ms: 0,
            version,
            interval_ms: 1000,
            repeat_for_ms: 5000,
            sequence,
            view,
            replica_index: 0,
            replication_factor: 2,
            factor_requested: 2,
            site_index: 0,
            sites: u32::MAX,
        }
    }

    const CUR: u32 = 10;
    const PAST: [u32; 4] = [9, 8, 0, 0];

    fn wins(new: TimerHead, new_tomb: bool, old: TimerHead, old_tomb: bool) -> bool {
        replaces(&new, new_tomb, &old, old_tomb, CUR, &PAST)
    }

    #[test]
    fn rule_2_current_view_beats_a_past_one_within_a_version() {
        // Whatever sequence says.
        assert!(wins(head(CUR, 1, 0), false, head(9, 1, 3), false));
        assert!(!wins(head(9, 1, 3), false, head(CUR, 1, 0), false));
        // An unknown view (0) loses to the current one too.
        assert!(!wins(head(0, 1, 3), false, head(CUR, 1, 0), false));
        // A resync's tombstone of the current view replaces the old copy.
        assert!(wins(head(CUR, 1, 0), true, head(9, 1, 0), false));
    }

    /// Issue 37: a client's delete or update taken by a node that has not
    /// reloaded yet (its view is past here) is still the newest change.
    #[test]
    fn rule_1_a_newer_version_of_a_past_view_beats_the_current_view() {
        assert!(wins(head(9, 5, 0), true, head(CUR, 1, 0), false));
        assert!(wins(head(9, 5, 0), false, head(CUR, 1, 3), false));
        assert!(wins(head(0, 5, 0), true, head(CUR, 1, 0), false));
        assert!(!wins(head(CUR, 1, 9), false, head(9, 5, 0), true));
    }

    #[test]
    fn rule_2_a_view_never_held_is_judged_by_sequence() {
        // 11 is neither current nor past: a peer reloaded first.
        assert!(wins(head(11, 1, 2), false, head(CUR, 1, 1), false));
        assert!(!wins(head(11, 1, 1), false, head(CUR, 1, 2), false));
        assert!(wins(head(11, 2, 0), false, head(CUR, 1, 5), false));
    }

    #[test]
    fn rule_1_newer_version_wins() {
        assert!(wins(head(CUR, 2, 0), false, head(CUR, 1, 9), false));
        assert!(!wins(head(CUR, 1, 9), false, head(CUR, 2, 0), false));
        // A newer client update beats an older tombstone, and vice versa.
        assert!(wins(head(CUR, 2, 0), false, head(CUR, 1, 0), true));
        assert!(wins(head(CUR, 2, 0), true, head(CUR, 1, 0), false));
    }

    #[test]
    fn rule_3_more_pops_win_within_a_version() {
        assert!(wins(head(CUR, 1, 3), false, head(CUR, 1, 2), false));
        assert!(!wins(head(CUR, 1, 2), false, head(CUR, 1, 3), false));
    }

    #[test]
    fn rule_4_a_tombstone_wins_a_tie() {
        assert!(wins(head(CUR, 1, 2), true, head(CUR, 1, 2), false));
        assert!(!wins(head(CUR, 1, 2), false, head(CUR, 1, 2), true));
        // The same message twice changes nothing.
        assert!(!wins(head(CUR, 1, 2), false, head(CUR, 1, 2), false));
        assert!(!wins(head(CUR, 1, 2), true, head(CUR, 1, 2), true));
    }

    /// A re-send passes only with a newer version: never by sequence (a
    /// pop left to the next replica), never as a tombstone at a tie (a
    /// resync's), and never by view alone.
    #[test]
    fn a_re_send_passes_only_with_a_newer_version() {
        let re = |new: TimerHead, new_tomb, old: TimerHead, old_tomb| {
            admits(
                Source::PeerIfNewer,
                (&new, new_tomb),
                (&old, old_tomb),
                CUR,
                &PAST,
            )
        };
        let peer = |new: TimerHead, new_tomb, old: TimerHead, old_tomb| {
            admits(Source::Peer, (&new, new_tomb), (&old, old_tomb), CUR, &PAST)
        };
        for (new, new_tomb, old, old_tomb, as_peer, as_re_send) in [
            (head(CUR, 2, 0), true, head(CUR, 1, 0), false, true, true),
            (head(CUR, 2, 0), false, head(CUR, 1, 3), false, true, true),
            (head(CUR, 1, 1), true, head(CUR, 1, 0), false, true, false),
            (head(CUR, 1, 0), true, head(CUR, 1, 0), false, true, false),
            (head(CUR, 1, 2), false, head(CUR, 1, 1), false, true, false),
            (head(CUR, 1, 0), false, head(CUR, 2, 0), true, false, false),
            (head(9, 3, 0), true, head(CUR, 1, 0), false, true, true),
            (head(9, 1, 0), true, head(CUR, 1, 0), false, false, false),
            (head(CUR, 1, 0), false, head(9, 1, 0), false, true, false),
        ] {
            assert_eq!(
                peer(new, new_tomb, old, old_tomb),
                as_peer,
                "{new:?} over {old:?}"
            );
            assert_eq!(
                re(new, new_tomb, old, old_tomb),
                as_re_send,
                "{new:?} over {old:?}"
            );
        }
        let client = admits(
            Source::Client,
            (&head(9, 1, 0), false),
            (&head(CUR, 5, 5), true),
            CUR,
            &PAST,
        );
        assert!(client, "a client's change always applies");
    }

    #[test]
    fn past_views_lose_among_themselves_by_version() {
        // Neither is current: version and sequence decide.
        assert!(wins(head(9, 2, 0), false, head(8, 1, 0), false));
        assert!(!wins(head(8, 1, 0), false, head(9, 2, 0), false));
    }
}
