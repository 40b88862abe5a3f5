//! A timer's callback bytes as a shard keeps them: one pointer per timer.
//!
//! Two forms behind one handle ([`Callback`], 8 bytes):
//! - **shared**: the URI alone, interned in this thread's table (a shard
//!   is a thread), so timers that call the same target share its bytes;
//!   the timer keeps its opaque data inline (`Timer`'s buffer). Looking up
//!   a URI already in the table allocates nothing. An entry leaves the
//!   table with its last handle, so the table holds at most one entry per
//!   distinct URI of the live handles, and at most [`INTERNED_MAX`]: past
//!   that a new URI has an entry of its own, outside the table (not
//!   shared, as before interning), so the table never rehashes more than
//!   that many entries when it grows (hashbrown rehashes all at once, the
//!   stall the ID index grows incrementally to avoid). The empty
//!   URI (tombstones) is one entry kept for the thread's life.
//! - **own**: tag pairs, URI and opaque data in one allocation of this
//!   timer's (tags, or opaque data too long for the inline buffer); never
//!   in the table.
//!
//! Handles are `Rc`s: a pop's callback shares them without a copy, and
//! they never leave their thread (`Rc` is not `Send`).

use crate::murmur::murmur3_x86_32;
use hashbrown::HashTable;
use std::cell::RefCell;
use std::rc::Rc;

/// URIs in a thread's table at most (its buckets: 32,768 at most, 9 bytes
/// each). Timers rarely call more targets than this; where every timer
/// has a URI of its own, the URIs past it are simply not shared.
pub const INTERNED_MAX: usize = 16_384;

/// Bytes of one `(tag index, count)` pair in an own form.
pub const TAG_BYTES: usize = 8;

/// A shared form's URI up to this many bytes is kept in its entry, so a
/// distinct URI costs one allocation (80 bytes with the counters); a
/// longer one has a second.
const URI_INLINE_BYTES: usize = 47;

enum Bytes {
    Inline([u8; URI_INLINE_BYTES]),
    Heap(Box<[u8]>),
}

struct Entry {
    /// Shared form: the URI. Own form: tag pairs, the URI, the opaque data.
    bytes: Bytes,
    uri_len: u16,
    /// Own form: bytes of the timer's extensions after the opaque data
    /// (`timer::extras`: the delivery policy), 0 without.
    ext_len: u16,
    tag_count: u8,
    /// Own form (never in the table).
    own: bool,
    /// In the table (a shared form, but not the empty URI's nor one made
    /// past `INTERNED_MAX`).
    in_table: bool,
}

const _: () = assert!(std::mem::size_of::<Entry>() <= 56, "80-byte allocations");

impl Entry {
    fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Inline(b) => &b[..self.uri_len as usize],
            Bytes::Heap(b) => b,
        }
    }

    fn uri_bytes(&self) -> &[u8] {
        let at = self.tag_count as usize * TAG_BYTES;
        &self.data()[at..at + self.uri_len as usize]
    }
}

/// A handle on a timer's callback bytes (see the module's notes).
pub struct Callback(Rc<Entry>);

thread_local! {
    /// This thread's (shard's) interned URIs: shared-form entries only.
    /// Bounded by the live handles (an entry leaves with its last one).
    static TABLE: RefCell<HashTable<Rc<Entry>>> = const { RefCell::new(HashTable::new()) };
    /// The empty URI (tombstones): kept for the thread's life, so that
    /// making a tombstone never allocates.
    static EMPTY: Rc<Entry> = Rc::new(Entry {
        bytes: Bytes::Inline([0; URI_INLINE_BYTES]),
        uri_len: 0,
        ext_len: 0,
        tag_count: 0,
        own: false,
        in_table: false,
    });
}

/// The table's hash of a URI: MurmurHash3 spread over 64 bits (the table
/// filters probes on the top bits).
fn hash_of(uri: &[u8]) -> u64 {
    u64::from(murmur3_x86_32(uri, 0x5eed_c0de)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Callback {
    /// The shared form of `uri` (at most `u16::MAX` bytes): the table's
    /// entry when there is one (no allocation), else a new one (in the
    /// table while it holds fewer than `INTERNED_MAX`).
    pub fn interned(uri: &str) -> Callback {
        assert!(uri.len() <= u16::MAX as usize, "the codec caps URIs");
        if uri.is_empty() {
            return Callback(EMPTY.with(|e| e.clone()));
        }
        let hash = hash_of(uri.as_bytes());
        TABLE.with(|table| {
            let mut table = table.borrow_mut();
            let found = table.find(hash, |e| e.data() == uri.as_bytes());
            if let Some(e) = found {
                return Callback(e.clone());
            }
            let bytes = match uri.len() {
                len if len <= URI_INLINE_BYTES => {
                    let mut inline = [0; URI_INLINE_BYTES];
                    inline[..len].copy_from_slice(uri.as_bytes());
                    Bytes::Inline(inline)
                }
                _ => Bytes::Heap(uri.as_bytes().into()),
            };
            let in_table = table.len() < INTERNED_MAX;
            let entry = Rc::new(Entry {
                bytes,
                uri_len: uri.len() as u16,
                ext_len: 0,
                tag_count: 0,
                own: false,
                in_table,
            });
            if in_table {
                table.insert_unique(hash, entry.clone(), |e| hash_of(e.data()));
            }
            Callback(entry)
        })
    }

    /// The own form: `tags` (at most `u8::MAX`), `uri` (at most
    /// `u16::MAX` bytes), `opaque` and the extensions `ext` (at most
    /// `u16::MAX` bytes, `timer::extras`) in one allocation.
    pub fn own(tags: &[(u32, u32)], uri: &str, opaque: &str, ext: &[u8]) -> Callback {
        assert!(uri.len() <= u16::MAX as usize, "the codec caps URIs");
        assert!(tags.len() <= u8::MAX as usize, "the codec caps tags");
        assert!(
            ext.len() <= u16::MAX as usize,
            "the codec caps a timer's extensions far below 64 KiB"
        );
        let bytes = tags.len() * TAG_BYTES + uri.len() + opaque.len() + ext.len();
        let mut data = Vec::with_capacity(bytes);
        for (index, count) in tags {
            data.extend_from_slice(&index.to_le_bytes());
            data.extend_from_slice(&count.to_le_bytes());
        }
        data.extend_from_slice(uri.as_bytes());
        data.extend_from_slice(opaque.as_bytes());
        data.extend_from_slice(ext);
        Callback(Rc::new(Entry {
            bytes: Bytes::Heap(data.into()),
            uri_len: uri.len() as u16,
            ext_len: ext.len() as u16,
            tag_count: tags.len() as u8,
            own: true,
            in_table: false,
        }))
    }

    /// Whether the opaque data and tags are here (own form) rather than in
    /// the timer.
    pub fn is_own(&self) -> bool {
        self.0.own
    }

    pub fn uri_len(&self) -> usize {
        self.0.uri_len as usize
    }

    /// The callback URI.
    pub fn uri(&self) -> &str {
        std::str::from_utf8(self.0.uri_bytes()).expect("stored from a str")
    }

    /// The opaque data of an own form (empty in a shared one).
    pub fn opaque(&self) -> &str {
        let at = self.0.tag_count as usize * TAG_BYTES + self.0.uri_len as usize;
        let data = self.0.data();
        let end = data.len() - self.0.ext_len as usize;
        std::str::from_utf8(&data[at..end]).expect("stored from a str")
    }

    /// The extensions of an own form (`timer::extras`; none in a shared one).
    pub fn ext(&self) -> &[u8] {
        let data = self.0.data();
        &data[data.len() - self.0.ext_len as usize..]
    }

    /// The tag pairs of an own form, [`TAG_BYTES`] each (none in a shared one).
    pub fn tag_bytes(&self) -> &[u8] {
        &self.0.data()[..self.0.tag_count as usize * TAG_BYTES]
    }

    /// Handles on this entry (the table's included).
    #[cfg(test)]
    fn handles(&self) -> usize {
        Rc::strong_count(&self.0)
    }
}

impl Clone for Callback {
    fn clone(&self) -> Callback {
        Callback(self.0.clone())
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        // The table's handle and this one: the last timer using the URI.
        if !self.0.in_table || Rc::strong_count(&self.0) != 2 {
            return;
        }
        let hash = hash_of(self.0.uri_bytes());
        // At thread exit the table may be gone before the last timers.
        let _ = TABLE.try_with(|table| {
            let mut table = table.borrow_mut();
            if let Ok(e) = table.find_entry(hash, |e| Rc::ptr_eq(e, &self.0)) {
                e.remove();
            }
        });
    }
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callback")
            .field("uri", &self.uri())
            .field("own", &self.0.own)
            .finish()
    }
}

/// URIs in this thread's table.
pub fn interned_count() -> usize {
    TABLE.with(|table| table.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_uri_is_shared_and_freed_with_its_last_handle() {
        let before = interned_count();
        let a = Callback::interned("http://intern.test/a");
        let b = Callback::interned("http://intern.test/a");
        assert!(Rc::ptr_eq(&a.0, &b.0), "the same bytes");
        assert_eq!(interned_count(), before + 1);
        assert_eq!(a.handles(), 3, "two handles and the table's");
        let c = a.clone();
        drop(a);
        drop(b);
        assert_eq!(interned_count(), before + 1, "one handle left");
        assert_eq!(c.uri(), "http://intern.test/a");
        drop(c);
        assert_eq!(interned_count(), before, "freed with the last handle");
        let again = Callback::interned("http://intern.test/a");
        assert_eq!(again.handles(), 2, "a new entry");
    }

    #[test]
    fn long_uris_are_interned_too() {
        let long = format!("http://intern.test/{}", "p".repeat(URI_INLINE_BYTES));
        let a = Callback::interned(&long);
        let b = Callback::interned(&long);
        assert!(Rc::ptr_eq(&a.0, &b.0));
        assert_eq!(a.uri(), long);
        let short = Callback::interned(&long[..URI_INLINE_BYTES]);
        assert!(!Rc::ptr_eq(&a.0, &short.0));
        assert_eq!(short.uri(), &long[..URI_INLINE_BYTES]);
    }

    #[test]
    fn distinct_uris_are_distinct_entries() {
        let before = interned_count();
        let all: Vec<Callback> = (0..1000)
            .map(|i| Callback::interned(&format!("http://intern.test/{i}")))
            .collect();
        assert_eq!(interned_count(), before + 1000);
        for (i, c) in all.iter().enumerate() {
            assert_eq!(c.uri(), format!("http://intern.test/{i}"));
            assert!(!c.is_own() && c.opaque().is_empty() && c.tag_bytes().is_empty());
        }
        drop(all);
        assert_eq!(interned_count(), before);
    }

    #[test]
    fn past_the_bound_a_uri_has_an_entry_of_its_own() {
        let before = interned_count();
        let all: Vec<Callback> = (0..INTERNED_MAX + 10)
            .map(|i| Callback::interned(&format!("http://bound.test/{i}")))
            .collect();
        assert_eq!(interned_count(), INTERNED_MAX.max(before));
        let last = format!("http://bound.test/{}", INTERNED_MAX + 9);
        let again = Callback::interned(&last);
        assert!(
            !Rc::ptr_eq(&again.0, &all[INTERNED_MAX + 9].0),
            "not shared"
        );
        assert_eq!((again.uri(), again.opaque()), (last.as_str(), ""));
        let first = Callback::interned("http://bound.test/0");
        assert!(Rc::ptr_eq(&first.0, &all[0].0), "interned ones still are");
        drop((all, again, first));
        assert_eq!(interned_count(), before);
        let shared = Callback::interned("http://bound.test/after");
        assert_eq!(
            interned_count(),
            before + 1,
            "interned again once there is room"
        );
        drop(shared);
    }

    #[test]
    fn own_forms_stay_out_of_the_table() {
        let before = interned_count();
        let shared = Callback::interned("http://intern.test/own");
        let own = Callback::own(&[(1, 2)], "http://intern.test/own", "data", b"x");
        assert_eq!(interned_count(), before + 1);
        assert!(own.is_own() && !Rc::ptr_eq(&shared.0, &own.0));
        assert_eq!(
            (own.uri(), own.opaque(), own.tag_bytes().len()),
            ("http://intern.test/own", "data", TAG_BYTES)
        );
        assert_eq!(own.ext(), b"x");
        let own2 = own.clone();
        drop(own);
        drop(own2);
        assert_eq!(interned_count(), before + 1, "the shared entry stays");
        drop(shared);
        assert_eq!(interned_count(), before);
    }

    #[test]
    fn the_empty_uri_is_one_entry_outside_the_table() {
        let before = interned_count();
        let t = Callback::interned("");
        let u = Callback::interned("");
        assert!(Rc::ptr_eq(&t.0, &u.0));
        assert_eq!((t.uri(), t.uri_len(), interned_count()), ("", 0, before));
        drop((t, u));
        assert_eq!(EMPTY.with(Rc::strong_count), 1, "kept");
    }
}
