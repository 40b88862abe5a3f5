//! Bulk work on a shard without holding up its pops: a resync moves a
//! million timers on the same core that pops them.
//!
//! A task that only yields stays runnable, and glommio polls its reactor
//! (timers, sockets) only when no task is runnable or its 100 ms preemption
//! quantum has passed, so due pops would wait that long. Bulk work is cut
//! into stretches of at most [`STRETCH`] with a [`breathe`] between them:
//! a [`Pacer`] looks at the clock between items and breathes once the
//! stretch is used up, so the bound holds whatever an item costs.
//!
//! [`metered`] measures how long each poll of a bulk task holds the thread
//! (one stretch without a breath), in CPU and wall-clock time, into a
//! node-wide histogram, [`stretches`]: the cause of a late pop, if a
//! resync is it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The longest a bulk task runs between breaths (when one item is
/// shorter: a breath comes after the item that crosses it).
pub const STRETCH: Duration = Duration::from_micros(200);

/// Elements a sort run holds (sorted in one go, about 0.1 ms for 16-byte
/// keys); merges look at the clock every `CHECK_EVERY` moves.
pub const CHUNK: usize = 4_096;
const CHECK_EVERY: usize = 1_024;

/// Let the reactor run: a sleep parks the task, the other runnable tasks
/// run, then the reactor. On a reused timer: a connection breathes every
/// half millisecond under load.
pub async fn breathe() {
    super::sleep::sleep(Duration::from_micros(1)).await;
}

/// Breathes once per [`STRETCH`] of work: call [`Pacer::tick`] between
/// items, [`Pacer::restart`] after any other await (it may have parked).
pub struct Pacer {
    resumed: Instant,
    /// [`STRETCH`], or `Duration::MAX` for a pacer that never breathes.
    stretch: Duration,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new()
    }
}

impl Pacer {
    pub fn new() -> Pacer {
        Pacer {
            resumed: Instant::now(),
            stretch: STRETCH,
        }
    }

    /// A pacer that never breathes: for bulk code run outside an executor
    /// (a fuzz target, a synchronous caller), where its futures are then
    /// ready at the first poll.
    pub fn unpaced() -> Pacer {
        Pacer {
            resumed: Instant::now(),
            stretch: Duration::MAX,
        }
    }

    /// The stretch starts now (the task just resumed).
    pub fn restart(&mut self) {
        self.resumed = Instant::now();
    }

    /// Whether this stretch is used up.
    pub fn due(&self) -> bool {
        self.resumed.elapsed() >= self.stretch
    }

    /// Breathe if this stretch is used up.
    pub async fn tick(&mut self) {
        if self.due() {
            breathe().await;
            self.restart();
        }
    }
}

/// Upper bounds (µs) of the stretch histogram's buckets; the last bucket
/// holds everything longer.
pub const STRETCH_BOUNDS_US: [u64; 7] = [50, 100, 200, 500, 1_000, 2_000, 5_000];
static STRETCH_COUNTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
static STRETCH_US_MAX: AtomicU64 = AtomicU64::new(0);
static STRETCH_WALL_US_MAX: AtomicU64 = AtomicU64::new(0);

/// What a stretch is measured by: the thread's CPU time (what the work
/// costs, whatever else the machine runs) and the wall clock (what a pop
/// waiting behind it sees, the kernel's preemptions included).
struct Mark {
    cpu_ns: u64,
    wall: Instant,
}

/// The calling thread's CPU time in ns (0 if the clock fails).
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    match rc {
        0 => t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64,
        _ => 0,
    }
}

impl Mark {
    fn now() -> Mark {
        Mark {
            cpu_ns: thread_cpu_ns(),
            wall: Instant::now(),
        }
    }

    /// Count the stretch since this mark.
    fn record(&self) {
        let us = thread_cpu_ns().saturating_sub(self.cpu_ns) / 1_000;
        let bucket = STRETCH_BOUNDS_US.partition_point(|&b| b < us);
        STRETCH_COUNTS[bucket].fetch_add(1, Relaxed);
        STRETCH_US_MAX.fetch_max(us, Relaxed);
        let wall_us = self.wall.elapsed().as_micros().min(u64::MAX as u128) as u64;
        STRETCH_WALL_US_MAX.fetch_max(wall_us, Relaxed);
    }
}

/// The node's stretches of bulk work so far: the longest in CPU time and
/// in wall-clock time (µs), and the count per bucket (CPU time) of
/// [`STRETCH_BOUNDS_US`].
pub fn stretches() -> (u64, u64, [u64; 8]) {
    let counts = std::array::from_fn(|i| STRETCH_COUNTS[i].load(Relaxed));
    let (cpu, wall) = (&STRETCH_US_MAX, &STRETCH_WALL_US_MAX);
    (cpu.load(Relaxed), wall.load(Relaxed), counts)
}

/// Run `f`, recording how long each of its polls holds the thread.
pub async fn metered<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(move |cx| {
        let mark = Mark::now();
        let polled = f.as_mut().poll(cx);
        mark.record();
        polled
    })
    .await
}

/// Run `f` (synchronous bulk work) as one recorded stretch.
pub fn timed<T>(f: impl FnOnce() -> T) -> T {
    let mark = Mark::now();
    let out = f();
    mark.record();
    out
}

/// Sort `v` with a breath at least every [`STRETCH`]: runs of [`CHUNK`]
/// are sorted, then merged pairwise, level by level, each merge
/// resumable. `O(n log n)`; one buffer of `n` elements.
pub async fn sort<T: Ord + Copy + Default + Send + 'static>(mut v: Vec<T>) -> Vec<T> {
    let n = v.len();
    let mut pacer = Pacer::new();
    for run in v.chunks_mut(CHUNK) {
        run.sort_unstable();
        pacer.tick().await;
    }
    // The buffer is filled in slices too: 16 MB written in one go is ms,
    // and even 1 MB (256 page faults) took 0.7 ms on a loaded machine.
    let mut buf = Vec::with_capacity(n);
    while buf.len() < n {
        buf.resize((buf.len() + CHUNK).min(n), T::default());
        pacer.tick().await;
    }
    let mut width = CHUNK;
    while width < n {
        for start in (0..n).step_by(2 * width) {
            let mid = (start + width).min(n);
            let end = (start + 2 * width).min(n);
            let (mut i, mut j, mut o) = (start, mid, start);
            while o < end {
                // A slice of at most CHECK_EVERY moves, then the clock.
                let slice_end = (o + CHECK_EVERY).min(end);
                while o < slice_end {
                    let take_left = j >= end || (i < mid && v[i] <= v[j]);
                    buf[o] = if take_left { v[i] } else { v[j] };
                    i += usize::from(take_left);
                    j += usize::from(!take_left);
                    o += 1;
                }
                pacer.tick().await;
            }
        }
        std::mem::swap(&mut v, &mut buf);
        width *= 2;
    }
    debug_assert!(v.windows(2).all(|w| w[0] <= w[1]), "sorted");
    drop_aside(buf);
    v
}

/// Vectors smaller than this are freed in place.
const DROP_ASIDE_BYTES_MIN: usize = 1 << 20;
/// Vectors waiting for the freeing thread (a few sessions' worth); when
/// they are this many, the next is freed in place.
const DROP_ASIDE_QUEUE_MAX: usize = 4;

/// Something the freeing thread drops.
type Doomed = Box<dyn Send>;

/// The node's one freeing thread, started at first use (`None`: it could
/// not be started, and vectors are freed in place).
fn freer() -> Option<&'static std::sync::mpsc::SyncSender<Doomed>> {
    static FREER: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<Doomed>>> =
        std::sync::OnceLock::new();
    FREER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Doomed>(DROP_ASIDE_QUEUE_MAX);
            let spawned = std::thread::Builder::new()
                .name("chronos-free".into())
                // Ends when every sender is gone (never: the sender is
                // static); each message is dropped as it comes.
                .spawn(move || rx.into_iter().for_each(drop));
            spawned.ok().map(|_| tx)
        })
        .as_ref()
}

/// Free `value` (a vector of megabytes) on the node's freeing thread:
/// giving 16 MB back to the kernel took 1-2.5 ms on the shard's thread.
/// Small vectors, and any while [`DROP_ASIDE_QUEUE_MAX`] wait or when no
/// thread could be made, are freed here. Never blocks.
pub fn drop_aside<T: Send + 'static>(value: Vec<T>) {
    if value.capacity() * std::mem::size_of::<T>() < DROP_ASIDE_BYTES_MIN {
        return;
    }
    if let Some(tx) = freer() {
        // Full or gone: the error hands `value` back, dropped here.
        let _ = tx.try_send(Box::new(value));
    }
}

/// Keep the elements of `v` that `keep(last kept, element)` accepts, in
/// order, looking at the clock every [`CHECK_EVERY`] elements.
pub async fn retain<T: Copy>(
    v: &mut Vec<T>,
    pacer: &mut Pacer,
    mut keep: impl FnMut(Option<&T>, &T) -> bool,
) {
    let mut kept: usize = 0;
    for read in 0..v.len() {
        let last = kept.checked_sub(1).map(|i| v[i]);
        if keep(last.as_ref(), &v[read]) {
            v[kept] = v[read];
            kept += 1;
        }
        if read % CHECK_EVERY == CHECK_EVERY - 1 {
            pacer.tick().await;
        }
    }
    v.truncate(kept);
}

/// The elements of the array that is member `key` of the JSON object
/// `text`, each parsed as a `T`, and `text` with that array emptied (for
/// the caller to parse for the other members); a breath whenever
/// `pacer`'s stretch is used up. When `text` starts `{"<key>":[` (as
/// this service writes it) each element is parsed in place, in one pass;
/// otherwise [`split_array`] finds them first. `Err`: what is not JSON.
pub async fn parse_array<'a, T: serde::Deserialize<'a>>(
    text: &'a [u8],
    key: &str,
    pacer: &mut Pacer,
) -> Result<(Vec<T>, Vec<u8>), String> {
    parse_array_fast(text, key, pacer, |_| None).await
}

/// [`parse_array`] with a reader of its own for the elements, tried first
/// on each element parsed in place: `fast(rest)` reads the element at the
/// start of `rest` and returns it and the bytes it took, or `None`, and
/// serde then reads it. It must accept only what serde accepts, as serde
/// would read it, and take exactly the element's bytes.
pub async fn parse_array_fast<'a, T: serde::Deserialize<'a>>(
    text: &'a [u8],
    key: &str,
    pacer: &mut Pacer,
    mut fast: impl FnMut(&'a [u8]) -> Option<(T, usize)>,
) -> Result<(Vec<T>, Vec<u8>), String> {
    let head = format!("{{\"{key}\":[");
    if !text.starts_with(head.as_bytes()) {
        let (elements, rest) = split_array(text, key.as_bytes(), pacer).await?;
        let mut out = Vec::with_capacity(elements.len());
        for element in elements {
            pacer.tick().await;
            out.push(serde_json::from_slice(element).map_err(|e| e.to_string())?);
        }
        return Ok((out, rest));
    }
    let skip = |at: usize| {
        at + text[at..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count()
    };
    let mut at = skip(head.len());
    let mut out = Vec::new();
    while text.get(at) != Some(&b']') || !out.is_empty() {
        pacer.tick().await;
        if let Some((value, used)) = fast(&text[at..]) {
            // The reader's contract (one whole element, never past the
            // text); a page comes from a peer, so a broken contract is the
            // page's error, not a crash (the resync_page fuzz target holds
            // the reader to it).
            if used == 0 || at + used > text.len() {
                return Err("the entry reader did not take one element of the text".into());
            }
            out.push(value);
            at = skip(at + used);
        } else {
            let mut values = serde_json::Deserializer::from_slice(&text[at..]).into_iter::<T>();
            let value = values.next().ok_or("truncated JSON")?;
            out.push(value.map_err(|e| e.to_string())?);
            at = skip(at + values.byte_offset());
        }
        match text.get(at) {
            Some(b',') => at += 1,
            Some(b']') => break,
            _ => return Err(format!("expected , or ] at byte {at}")),
        }
    }
    // Bounded by `text`: each element takes at least one byte of it.
    let mut rest = head.into_bytes();
    rest.extend_from_slice(&text[at..]);
    Ok((out, rest))
}

/// Bytes of JSON the splitter looks at between looks at the clock (about
/// 20 µs).
const SPLIT_SLICE: usize = 16 * 1024;

/// The elements of the array that is member `key` of the top-level JSON
/// object `text`, found without parsing them, in slices with breaths
/// between (a 400 KB page parsed in one go held the reactor for about a
/// millisecond): `(elements, rest)`, where `rest` is `text` with that
/// array emptied, for the caller to parse for the other members (which
/// also checks the structure). Each element is checked only for balanced
/// brackets: the caller parses it. Memory: one span per element, at most
/// one per two bytes of `text`.
pub async fn split_array<'a>(
    text: &'a [u8],
    key: &[u8],
    pacer: &mut Pacer,
) -> Result<(Vec<&'a [u8]>, Vec<u8>), &'static str> {
    let mut s = Splitter::default();
    let mut from = 0;
    while from < text.len() {
        let to = (from + SPLIT_SLICE).min(text.len());
        for (i, &b) in text.iter().enumerate().take(to).skip(from) {
            s.step(text, key, i, b)?;
        }
        from = to;
        pacer.tick().await;
    }
    let (Some(open), Some(close)) = (s.open, s.close) else {
        return Err("no array under the expected key");
    };
    if s.depth != 0 || s.in_string {
        return Err("truncated JSON");
    }
    // The splitter found both brackets inside the text, in order: its
    // own invariant, yet the text is a peer's, so an error, not a crash.
    if !(open < close && close < text.len()) {
        return Err("the array's brackets are not in order");
    }
    let mut rest = Vec::with_capacity(open + 1 + text.len() - close);
    rest.extend_from_slice(&text[..=open]);
    rest.extend_from_slice(&text[close..]);
    let elements = s.elements.iter().map(|&(a, b)| &text[a..b]).collect();
    Ok((elements, rest))
}

/// The state of [`split_array`] between bytes.
#[derive(Default)]
struct Splitter {
    /// Brackets open (the top-level object is depth 1).
    depth: usize,
    in_string: bool,
    escaped: bool,
    string_from: usize,
    /// The last string closed at depth 1: the key of a value that follows.
    last_key: (usize, usize),
    /// The wanted array's brackets.
    open: Option<usize>,
    close: Option<usize>,
    element_from: Option<usize>,
    after_comma: bool,
    elements: Vec<(usize, usize)>,
}

impl Splitter {
    /// Directly inside the wanted array.
    fn in_array(&self) -> bool {
        self.depth == 2 && self.open.is_some() && self.close.is_none()
    }

    fn step(&mut self, text: &[u8], key: &[u8], i: usize, b: u8) -> Result<(), &'static str> {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 1 {
                    self.last_key = (self.string_from + 1, i);
                }
            }
            return Ok(());
        }
        let (k0, k1) = self.last_key;
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => {}
            b'[' if self.depth == 1 && self.open.is_none() && &text[k0..k1] == key => {
                self.open = Some(i);
                self.depth += 1;
            }
            b']' if self.in_array() => {
                self.end_element(i, true)?;
                self.close = Some(i);
                self.depth -= 1;
            }
            b',' if self.in_array() => self.end_element(i, false)?,
            _ => {
                if self.in_array() && self.element_from.is_none() {
                    self.element_from = Some(i);
                }
                match b {
                    b'"' => (self.in_string, self.string_from) = (true, i),
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => self.depth = self.depth.checked_sub(1).ok_or("unbalanced")?,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// An element ends at `i` (a comma, or the array's end when `last`).
    fn end_element(&mut self, i: usize, last: bool) -> Result<(), &'static str> {
        match self.element_from.take() {
            Some(from) => self.elements.push((from, i)),
            // `[]`
            None if last && !self.after_comma && self.elements.is_empty() => {}
            None => return Err("an empty array element"),
        }
        self.after_comma = !last;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn drop_aside_uses_one_thread() {
        for _ in 0..64 {
            super::drop_aside(vec![1u8; 2 << 20]);
            super::drop_aside(vec![1u8; 16]);
        }
        let freeing = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
            .filter(|name| name.trim() == "chronos-free")
            .count();
        assert_eq!(freeing, 1, "one freeing thread, however many vectors");
    }

    #[test]
    fn unpaced_work_is_ready_at_once() {
        let mut v: Vec<u32> = (0..100_000).collect();
        let mut pacer = super::Pacer::unpaced();
        futures_lite::future::block_on(super::retain(&mut v, &mut pacer, |_, x| x % 2 == 0));
        assert_eq!(v.len(), 50_000);
    }

    #[test]
    fn retain_keeps_in_order_and_dedups() {
        let mut v: Vec<u32> = (0..5000).map(|i| i / 3).collect();
        glommio::LocalExecutor::default().run(async {
            let mut pacer = super::Pacer::new();
            super::retain(&mut v, &mut pacer, |last, x| last != Some(x) && x % 5 != 0).await;
        });
        let want: Vec<u32> = (0..1667).filter(|x| x % 5 != 0).collect();
        assert_eq!(v, want);
    }

    #[test]
    fn sorts_like_the_standard_sort() {
        for n in [
            0usize,
            1,
            7,
            super::CHUNK - 1,
            super::CHUNK,
            3 * super::CHUNK + 5,
            40 * super::CHUNK + 3,
        ] {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let v: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 1000
                })
                .collect();
            let mut want = v.clone();
            want.sort_unstable();
            let got = glommio::LocalExecutor::default().run(super::sort(v));
            assert_eq!(got, want, "n = {n}");
        }
    }

    fn split(text: &str) -> Result<(Vec<String>, String), &'static str> {
        glommio::LocalExecutor::default().run(async {
            let mut pacer = super::Pacer::new();
            let (elements, rest) =
                super::split_array(text.as_bytes(), b"timers", &mut pacer).await?;
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            Ok((elements.iter().map(|e| text(e)).collect(), text(&rest)))
        })
    }

    #[test]
    fn split_finds_the_elements_serde_finds() {
        let cases = [
            r#"{"timers":[]}"#,
            r#"{"timers":[{"a":1}],"cursor":"x"}"#,
            r#" { "cursor" : "timers" , "timers" : [ {"a":"],\"["} , [1,[2]] ,3, "s" ] } "#,
            r#"{"other":[1,2],"x":{"timers":[9]},"timers":[{"timers":[1]},{}]}"#,
        ];
        for case in cases {
            let (elements, rest) = split(case).unwrap_or_else(|e| panic!("{case}: {e}"));
            let whole: serde_json::Value = serde_json::from_str(case).unwrap();
            let want: Vec<serde_json::Value> = whole["timers"].as_array().unwrap().clone();
            let got: Vec<serde_json::Value> = elements
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            assert_eq!(got, want, "{case}");
            let mut rest: serde_json::Value = serde_json::from_str(&rest).unwrap();
            let mut whole = whole;
            whole["timers"] = serde_json::json!([]);
            rest["timers"] = serde_json::json!([]);
            assert_eq!(rest, whole, "{case}");
        }
    }

    fn parse(text: &str) -> Result<(Vec<serde_json::Value>, String), String> {
        glommio::LocalExecutor::default().run(async {
            let mut pacer = super::Pacer::new();
            let (v, rest) = super::parse_array(text.as_bytes(), "timers", &mut pacer).await?;
            Ok((v, String::from_utf8(rest).unwrap()))
        })
    }

    #[test]
    fn parse_array_in_place_and_split_agree_with_serde() {
        let cases = [
            r#"{"timers":[]}"#,
            r#"{"timers":[ ] ,"cursor":"x"}"#,
            r#"{"timers":[{"a":1}],"cursor":"x"}"#,
            r#"{"timers":[ {"a":"],\"["} , [1,[2]] ,3, "s" ] }"#,
            r#"{"cursor":"x","timers":[{"a":1},2]}"#,
        ];
        for case in cases {
            let (got, rest) = parse(case).unwrap_or_else(|e| panic!("{case}: {e}"));
            let mut whole: serde_json::Value = serde_json::from_str(case).unwrap();
            assert_eq!(&got, whole["timers"].as_array().unwrap(), "{case}");
            whole["timers"] = serde_json::json!([]);
            let rest: serde_json::Value = serde_json::from_str(&rest).unwrap();
            assert_eq!(rest, whole, "{case}");
        }
        for bad in [
            r#"{"timers":[1,]}"#,
            r#"{"timers":[,1]}"#,
            r#"{"timers":[1 2]}"#,
            r#"{"timers":[1"#,
            r#"{"timers":[{"a":}]}"#,
            r#"{"timers":["#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn split_rejects_what_is_not_an_array_of_elements() {
        for bad in [
            r#"{"timers":[1,]}"#,
            r#"{"timers":[,1]}"#,
            r#"{"timers":[1,,2]}"#,
            r#"{"timers":[1}"#,
            r#"{"timers":[1"#,
            r#"{"timers":"[1]"}"#,
            r#"{"other":[1]}"#,
            r#"]]{"timers":[1]}"#,
            r#"{"timers":["1]}"#,
            "",
        ] {
            assert!(split(bad).is_err(), "{bad}");
        }
    }
}
