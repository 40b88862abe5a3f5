//! Next-fire times against an independent implementation: Python's
//! `croniter` with `zoneinfo` (issue 42).
//!
//! A generated corpus: hand-picked and pseudo-random cron expressions (5
//! and 6 fields) times zones with and without DST (a 30-minute change on
//! Lord Howe, a 45-minute offset on the Chatham Islands, changes at
//! midnight in Santiago), each from start
//! instants around every change of offset in 2025-2027 and a few away
//! from them, each a chain of 20 successive occurrences. The corpus goes
//! to a temporary JSON file, a small Python script computes croniter's
//! chains, and every occurrence must be equal. Where the rules differ on
//! purpose (croniter fires both passes of a local time shown twice, the
//! timer service the first only: `timer::calendar`'s module doc), the
//! script drops croniter's second passes and says how many. The random
//! expressions avoid what croniter 7.0.0 reads otherwise than cron: ranges
//! with equal ends (`12-12` read as `*`), and a day field written to allow
//! every value but not as `*` (`*/1`, `1-31`: see `every_day_not_star`).
//!
//! Also: a search allocates nothing (a counting allocator, per thread).
//!
//! Needs `python3` with `croniter` (`.ci/run` installs it); without it the
//! test fails and names the install step.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::process::Command;

use chronos::timer::calendar::{next_after, parse_at, Schedule, Zone};
use serde_json::{json, Value};

/// The pinned version `.ci/run` installs.
const INSTALL: &str = "pip install 'croniter==7.0.0'";
const CHAIN: usize = 20;
const ZONES: [&str; 7] = [
    "America/Santiago",
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "UTC",
];

/// Expressions that exercise each rule: every field form, names, Sunday
/// as 0 and 7, the day-of-month or day-of-week rule, and local times in
/// and around the changes of offset (01:00 to 03:59).
const HAND: [&str; 40] = [
    "* * * * *",
    "*/15 * * * *",
    "0 * * * *",
    "30 * * * *",
    "0 9 * * MON-FRI",
    "30 2 * * *",
    "0 2 * * *",
    "15 2 * * *",
    "45 1 * * *",
    "45 2 * * *",
    "0 3 * * *",
    "0 0 * * *",
    "*/20 2 * * *",
    "0 2-3 * * *",
    "0,30 1-3 * * *",
    "10-50/5 * * * *",
    "0 */2 * * *",
    "0 0 1 * *",
    "0 12 13 * FRI",
    "0 0 29 2 *",
    "0 8 * jan,Jul sun",
    "5 4 * * 7",
    "0 22 * * 1-5",
    "*/7 2 * * 0",
    "0 0 1,15 * 3",
    "59 23 31 12 *",
    "0 9 10/5 * *",
    "1-59/2 0-3 * MAR,OCT,NOV,APR SUN",
    "*/10 * * * * *",
    "30 30 2 * * *",
    "30 15 2 * * *",
    "0 0 0 * * *",
    "15,45 */30 1-3 * * *",
    "0 0 9 * * MON-FRI",
    "*/30 59 1 * * *",
    "0 30 1 * * *",
    "59 59 2 * * *",
    "0 45 2,3 * * *",
    "0 0 2 * * 6-7",
    "0 0 12 1-7 * MON",
];

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

/// One random field of values `min..=max`, with names if it has them.
/// Its ranges have two different ends: croniter 7.0.0 reads `12-12` as
/// `*` and `30-30/8` as `1-31/8`, where cron means 12 and 30.
fn random_field(rng: &mut Rng, min: u32, max: u32, names: &[&str]) -> String {
    let span = max - min + 1;
    let value = |rng: &mut Rng| {
        let v = min + rng.below(span);
        match names.get((v - min) as usize) {
            Some(name) if rng.below(3) == 0 => name.to_string(),
            _ => v.to_string(),
        }
    };
    match rng.below(7) {
        0 | 1 => "*".to_string(),
        2 => value(rng),
        3 => {
            let a = min + rng.below(span - 1);
            let b = a + 1 + rng.below(max - a);
            format!("{a}-{b}")
        }
        4 => format!("*/{}", 1 + rng.below(span.min(20))),
        5 => {
            let a = min + rng.below(span - 1);
            let b = a + 1 + rng.below(max - a);
            format!("{a}-{b}/{}", 1 + rng.below(span.min(12)))
        }
        _ => (0..2 + rng.below(3))
            .map(|_| value(rng))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Whether a day field allows every value without being `*` (`*/1`,
/// `1-31`, `0-7`). croniter then counts it as restricted unless the other
/// day field has a `*` somewhere in it; the timer service counts it as
/// unrestricted, always (`timer::calendar`'s module doc). The random
/// corpus leaves these out.
fn every_day_not_star(day: &str, weekday: &str) -> bool {
    let same = |a: String, b: &str| Schedule::parse(&a) == Schedule::parse(b);
    (day != "*" && same(format!("0 0 {day} * 1"), "0 0 * * 1"))
        || (weekday != "*" && same(format!("0 0 1 * {weekday}"), "0 0 1 * *"))
}

/// Random expressions the parser accepts: hours biased towards the
/// changes of offset, half of them with seconds.
fn random_expressions(count: usize) -> Vec<String> {
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let mut rng = Rng(42);
    let mut out = Vec::new();
    while out.len() < count {
        let hour = match rng.below(3) {
            0 => format!("{}", 1 + rng.below(3)),
            1 => format!("{}-{}", rng.below(2), 2 + rng.below(3)),
            _ => random_field(&mut rng, 0, 23, &[]),
        };
        let fields = [
            random_field(&mut rng, 0, 59, &[]),
            hour,
            random_field(&mut rng, 1, 31, &[]),
            random_field(&mut rng, 1, 12, &MONTHS),
            random_field(&mut rng, 0, 7, &DAYS),
        ];
        let mut text = fields.join(" ");
        if rng.below(2) == 0 {
            text = format!("{} {text}", random_field(&mut rng, 0, 59, &[]));
        }
        if Schedule::parse(&text).is_ok() && !every_day_not_star(&fields[2], &fields[4]) {
            out.push(text);
        }
    }
    out
}

/// Start instants (Unix ms) in a zone: around every change of offset in
/// 2025-2027, and a few away from them.
fn starts(zone: &Zone) -> Vec<i64> {
    let mut out: Vec<i64> = [
        "2025-01-15T10:00:00Z",
        "2026-07-01T00:00:00.500Z",
        "2027-12-31T23:00:00Z",
    ]
    .iter()
    .map(|t| parse_at(t).unwrap())
    .collect();
    let end = parse_at("2028-01-01T00:00:00Z").unwrap() / 1_000;
    let mut at = parse_at("2025-01-01T00:00:00Z").unwrap() / 1_000;
    while let Some(change) = zone.change_after(at).filter(|c| *c < end) {
        for delta in [-3 * 3_600 - 7, -3_600, -1, 1_800] {
            out.push((change + delta) * 1_000);
        }
        at = change;
    }
    out
}

/// The corpus: every hand expression from every start in every zone, and
/// each random one from four starts per zone, in turn.
fn corpus() -> Vec<Value> {
    let random = random_expressions(60);
    let mut cases = Vec::new();
    for zone_name in ZONES {
        let zone = Zone::parse(zone_name).unwrap();
        let starts = starts(&zone);
        for (i, expr) in HAND
            .iter()
            .map(|e| e.to_string())
            .chain(random.clone())
            .enumerate()
        {
            let picked: Vec<i64> = if i < HAND.len() {
                starts.clone()
            } else {
                (0..4).map(|k| starts[(i * 4 + k) % starts.len()]).collect()
            };
            for start in picked {
                cases.push(json!({"expr": expr, "zone": zone_name, "start": start}));
            }
        }
    }
    cases
}

const SCRIPT: &str = r#"
import json, sys
from datetime import datetime
from zoneinfo import ZoneInfo
from croniter import croniter

def second_pass(ts, zone):
    d = datetime.fromtimestamp(ts, zone)
    return d.fold == 1 and d.replace(fold=0).utcoffset() != d.utcoffset()

cases = json.load(open(sys.argv[1]))
chain = int(sys.argv[2])
out, dropped = [], 0
for case in cases:
    zone = ZoneInfo(case["zone"])
    start = datetime.fromtimestamp(case["start"] / 1000, zone)
    six = len(case["expr"].split()) == 6
    it = croniter(case["expr"], start, second_at_beginning=six)
    got = []
    # A local time shown twice can hold thousands of second passes.
    for _ in range(chain + 10000):
        ts = it.get_next(float)
        if second_pass(ts, zone):
            dropped += 1
            continue
        got.append([round(ts * 1000), datetime.fromtimestamp(ts, zone).isoformat()])
        if len(got) == chain:
            break
    out.append(got)
json.dump({"chains": out, "dropped": dropped}, sys.stdout)
"#;

/// Runs the script on the corpus: croniter's chains, and how many second
/// passes it dropped.
fn croniter_chains(cases: &[Value]) -> (Vec<Value>, u64) {
    let check = Command::new("python3")
        .args(["-c", "import croniter"])
        .output();
    let ready = check.as_ref().is_ok_and(|o| o.status.success());
    assert!(
        ready,
        "tests/calendar.rs needs python3 with croniter: run `{INSTALL}` (.ci/run does): {check:?}"
    );
    let dir: PathBuf =
        std::env::temp_dir().join(format!("chronos-calendar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.json");
    let script = dir.join("croniter_chains.py");
    std::fs::write(&corpus, serde_json::to_vec(cases).unwrap()).unwrap();
    std::fs::write(&script, SCRIPT).unwrap();
    let output = Command::new("python3")
        .arg(&script)
        .arg(&corpus)
        .arg(CHAIN.to_string())
        .output()
        .expect("run python3");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        output.status.success(),
        "the croniter script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    let chains = answer["chains"].as_array().unwrap().clone();
    (chains, answer["dropped"].as_u64().unwrap())
}

/// Our chain of `CHAIN` occurrences for one case.
fn our_chain(case: &Value) -> Vec<i64> {
    let schedule = Schedule::parse(case["expr"].as_str().unwrap()).unwrap();
    let zone = Zone::parse(case["zone"].as_str().unwrap()).unwrap();
    let mut at = case["start"].as_i64().unwrap();
    let mut out = Vec::new();
    while out.len() < CHAIN {
        match next_after(&schedule, &zone, at) {
            Some(next) => {
                assert!(next > at, "{case}: {next} is not after {at}");
                out.push(next);
                at = next;
            }
            None => break,
        }
    }
    out
}

#[test]
fn next_fire_times_equal_croniters() {
    let cases = corpus();
    assert!(cases.len() > 2_000, "a corpus of {} cases", cases.len());
    let (theirs, dropped) = croniter_chains(&cases);
    assert_eq!(theirs.len(), cases.len());
    let mut wrong = Vec::new();
    for (case, their) in cases.iter().zip(&theirs) {
        let their = their.as_array().unwrap();
        let their_ms: Vec<i64> = their.iter().map(|o| o[0].as_i64().unwrap()).collect();
        let ours = our_chain(case);
        if ours != their_ms {
            let at = ours
                .iter()
                .zip(&their_ms)
                .position(|(a, b)| a != b)
                .unwrap_or(ours.len().min(their_ms.len()));
            wrong.push(format!(
                "{case}: occurrence {at}: ours {:?}, croniter's {}",
                ours.get(at),
                their.get(at).map_or("none".to_string(), |o| o.to_string())
            ));
        }
    }
    let total = cases.len() * CHAIN;
    assert!(
        wrong.is_empty(),
        "{} of {} chains differ from croniter's; the first:\n{}",
        wrong.len(),
        cases.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The corpus crosses repeated local times, so croniter's second passes
    // were dropped (and every other occurrence compared).
    assert!(dropped > 0, "no repeated local time in {total} occurrences");
    println!(
        "{} chains, {total} occurrences equal; {dropped} second passes dropped",
        cases.len()
    );
}

/// Counts the allocations of the thread that asks (the tests run on
/// several threads at once).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's layout, as the system allocator requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn next_after_allocates_nothing() {
    let zones: Vec<Zone> = ZONES.iter().map(|z| Zone::parse(z).unwrap()).collect();
    let schedules: Vec<Schedule> = HAND.iter().map(|e| Schedule::parse(e).unwrap()).collect();
    let start = parse_at("2025-03-01T00:00:00Z").unwrap();
    COUNTING.with(|c| c.set(true));
    // The counter sees an allocation.
    drop(std::hint::black_box(Box::new(1u64)));
    assert_eq!(ALLOCATIONS.with(|n| n.replace(0)), 1);
    let mut occurrences = 0;
    for zone in &zones {
        for schedule in &schedules {
            let mut at = start;
            // Through both changes of offset of 2025 in every zone with
            // DST, from instants at least 5 h 7 min apart.
            while at < start + 300 * 86_400_000 {
                let next = next_after(schedule, zone, at).unwrap();
                at = next.max(at + 18_420_000);
                occurrences += 1;
            }
        }
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(
        ALLOCATIONS.with(Cell::get),
        0,
        "allocations in {occurrences} searches"
    );
}
