//! The requesting side of resync: a `GET /timers` page as a peer may send
//! it, read entry by entry (`runtime/bulk.rs`'s splitter and in-place
//! parse, `shard/resync/page.rs`'s one-pass entry reader). No input may
//! panic (the splitter's and the reader's asserts), whatever serde alone
//! refuses the resync refuses too, and where both read a page they find
//! the same number of entries. Half the inputs are spliced into a page's
//! `timers` array, where the fast paths do their work.
#![no_main]
use chronos::shard::resync::page::parse_page_both;
use libfuzzer_sys::fuzz_target;

fn check(body: &[u8]) {
    let (resync, serde_only) = parse_page_both(body);
    if serde_only.is_err() {
        assert!(resync.is_err(), "the resync read a page serde refuses");
    }
    if let (Ok(a), Ok(b)) = (&resync, &serde_only) {
        assert_eq!(a, b, "entries found");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut page = br#"{"timers":["#.to_vec();
    page.extend_from_slice(data);
    page.extend_from_slice(br#"],"cursor":null}"#);
    check(&page);
});
