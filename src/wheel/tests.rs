use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn drain(wheel: &mut Wheel<u64>, now_ms: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    wheel.poll(now_ms, usize::MAX, |_, due, v| out.push((due, v)));
    out.sort();
    out
}

#[test]
fn level_table() {
    // (elapsed, when, level): the level is the highest differing 6-bit digit.
    let table: &[(u64, u64, usize)] = &[
        (0, 0, 0),
        (0, 63, 0),
        (0, 64, 1),
        (0, 4095, 1),
        (0, 4096, 2),
        (0, (1 << 18) - 1, 2),
        (0, 1 << 18, 3),
        (0, 1 << 24, 4),
        (0, 1 << 30, 5),
        (0, SPAN_MS - 1, 5),
        (0, SPAN_MS, LEVELS),
        (63, 64, 1),
        (64, 127, 0),
        (4095, 4096, 2),
        (SPAN_MS - 1, SPAN_MS, LEVELS),
    ];
    for &(elapsed, when, level) in table {
        assert_eq!(
            level_for(elapsed, when),
            level,
            "elapsed={elapsed} when={when}"
        );
    }
}

#[test]
fn pops_table() {
    // (insert due times, poll times, expected pops per poll)
    struct Case {
        dues: &'static [u64],
        polls: &'static [u64],
        expect: &'static [&'static [u64]],
    }
    let cases = [
        Case {
            dues: &[5],
            polls: &[4, 5],
            expect: &[&[], &[5]],
        },
        Case {
            dues: &[0],
            polls: &[0],
            expect: &[&[0]],
        },
        Case {
            dues: &[64, 65],
            polls: &[63, 64, 65],
            expect: &[&[], &[64], &[65]],
        },
        Case {
            dues: &[4096, 100],
            polls: &[4095, 10_000],
            expect: &[&[100], &[4096]],
        },
        Case {
            dues: &[1 << 30, (1 << 30) + 1],
            polls: &[(1 << 30) - 1, 1 << 30, 1 << 31],
            expect: &[&[], &[1 << 30], &[(1 << 30) + 1]],
        },
        // Beyond the wheel's span: overflow list, still on time.
        Case {
            dues: &[SPAN_MS + 7, 3 * SPAN_MS],
            polls: &[SPAN_MS + 6, SPAN_MS + 7, 3 * SPAN_MS - 1, 3 * SPAN_MS],
            expect: &[&[], &[SPAN_MS + 7], &[], &[3 * SPAN_MS]],
        },
        // A jump far past everything pops everything, nothing early.
        Case {
            dues: &[1, 70, 5000, 300_000, 20_000_000],
            polls: &[u64::MAX / 2],
            expect: &[&[1, 70, 5000, 300_000, 20_000_000]],
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        let mut wheel = Wheel::new(0);
        for &due in case.dues {
            wheel.insert(due, due);
        }
        for (poll, expect) in case.polls.iter().zip(case.expect) {
            let got: Vec<u64> = drain(&mut wheel, *poll)
                .into_iter()
                .map(|(d, _)| d)
                .collect();
            assert_eq!(&got, expect, "case {n} poll {poll}");
        }
    }
}

#[test]
fn cancel_and_stale_keys() {
    let mut wheel = Wheel::new(0);
    let a = wheel.insert(10, 1u64);
    let b = wheel.insert(10, 2u64);
    assert_eq!(wheel.cancel(a), Some(1));
    assert_eq!(wheel.cancel(a), None, "double cancel");
    let c = wheel.insert(20, 3u64); // reuses a's slot
    assert_eq!(c.index(), a.index());
    assert_eq!(
        wheel.cancel(a),
        None,
        "stale key must not cancel the new entry"
    );
    assert_eq!(drain(&mut wheel, 30), vec![(10, 2), (20, 3)]);
    assert_eq!(wheel.cancel(b), None, "fired key is stale");
    assert!(wheel.is_empty());
}

#[test]
fn insert_in_the_past_fires_next_poll() {
    let mut wheel = Wheel::new(1000);
    wheel.insert(10, 7u64);
    assert_eq!(wheel.next_deadline_ms(), Some(1000));
    assert_eq!(drain(&mut wheel, 1000), vec![(10, 7)]);
}

#[test]
fn limit_resumes() {
    let mut wheel = Wheel::new(0);
    for i in 0..10u64 {
        wheel.insert(5 + i % 3, i);
    }
    let mut seen = 0;
    let mut rounds = 0;
    while !wheel.is_empty() {
        seen += wheel.poll(100, 3, |_, due, _| assert!(due <= 100));
        rounds += 1;
        assert!(rounds < 10);
    }
    assert_eq!(seen, 10);
}

#[test]
fn reschedule_keeps_key() {
    let mut wheel = Wheel::new(0);
    let k = wheel.insert(100, 1u64);
    assert!(wheel.reschedule(k, 50));
    assert_eq!(wheel.due_ms(k), Some(50));
    assert_eq!(drain(&mut wheel, 60), vec![(50, 1)]);
}

#[test]
fn earliest_from_is_ordered() {
    let mut wheel = Wheel::new(0);
    for due in [500u64, 10, 300, 20, 7000, 300] {
        wheel.insert(due, due);
    }
    let got: Vec<u64> = wheel
        .earliest_from(20, 4)
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(got, vec![20, 300, 300, 500]);
}

#[test]
fn insert_cancel_churn_keeps_records_bounded() {
    // Lazy cancel leaves stale records behind; compaction before growth must
    // keep them proportional to the live count, not to the number of cancels.
    let mut wheel = Wheel::new(0);
    let held: Vec<Key> = (0..1000u64).map(|i| wheel.insert(5_000 + i, i)).collect();
    for i in 0..200_000u64 {
        let k = wheel.insert(10_000 + i, i);
        assert_eq!(wheel.cancel(k), Some(i));
    }
    assert_eq!(wheel.len(), held.len());
    assert!(
        wheel.records_len() < 20_000,
        "records {} for {} live",
        wheel.records_len(),
        wheel.len()
    );
    assert_eq!(drain(&mut wheel, 10_000).len(), 1000);
    assert!(wheel.is_empty());
}

#[test]
fn reschedule_back_and_forth_fires_once() {
    let mut wheel = Wheel::new(0);
    let k = wheel.insert(100, 1u64);
    assert!(wheel.reschedule(k, 200));
    assert!(wheel.reschedule(k, 100));
    assert!(wheel.reschedule(k, 100));
    assert_eq!(drain(&mut wheel, 99), vec![]);
    assert_eq!(drain(&mut wheel, 100), vec![(100, 1)]);
    assert_eq!(drain(&mut wheel, 1000), vec![]);
    // The index is reused with the stale record's due: still one pop, on time.
    let k1 = wheel.insert(2000, 2u64);
    assert!(wheel.reschedule(k1, 3000));
    assert_eq!(wheel.cancel(k1), Some(2));
    let k2 = wheel.insert(3000, 3u64);
    assert_eq!(k2.index(), k1.index());
    assert_eq!(drain(&mut wheel, 2999), vec![]);
    assert_eq!(drain(&mut wheel, 3000), vec![(3000, 3)]);
    assert!(wheel.is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64),
    Cancel(usize),
    Reschedule(usize, u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![0u64..100, 0u64..5_000, 0u64..400_000, 0u64..(SPAN_MS * 2)].prop_map(Op::Insert),
        2 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), prop_oneof![0u64..100, 0u64..5_000, 0u64..400_000]).prop_map(|(p, d)| Op::Reschedule(p, d)),
        3 => prop_oneof![0u64..3, 0u64..200, 0u64..50_000, 0u64..(SPAN_MS)].prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The wheel against a BTreeMap model: same pops, never early, none lost.
    #[test]
    fn matches_btreemap_model(ops in proptest::collection::vec(op(), 1..300)) {
        let mut wheel = Wheel::new(0);
        let mut model: BTreeMap<(u64, u64), Key> = BTreeMap::new();
        let mut live: Vec<(u64, u64, Key)> = Vec::new();
        let mut now = 0u64;
        let mut next_id = 0u64;
        for op in ops {
            match op {
                Op::Insert(delta) => {
                    let due = now + delta;
                    let key = wheel.insert(due, next_id);
                    model.insert((due, next_id), key);
                    live.push((due, next_id, key));
                    next_id += 1;
                }
                Op::Cancel(pick) => {
                    if !live.is_empty() {
                        let (due, id, key) = live.swap_remove(pick % live.len());
                        prop_assert_eq!(wheel.cancel(key), Some(id));
                        model.remove(&(due, id));
                    }
                }
                Op::Reschedule(pick, delta) => {
                    if !live.is_empty() {
                        let n = pick % live.len();
                        let (due, id, key) = live[n];
                        let new_due = now + delta;
                        prop_assert!(wheel.reschedule(key, new_due));
                        model.remove(&(due, id));
                        model.insert((new_due, id), key);
                        live[n].0 = new_due;
                    }
                }
                Op::Advance(delta) => {
                    now += delta;
                    // Stale records may make the wheel wake early, never late.
                    if let (Some(next), Some(&(earliest, _))) = (wheel.next_deadline_ms(), model.keys().next()) {
                        prop_assert!(next <= earliest.max(wheel.elapsed_ms()));
                    }
                    let mut got = Vec::new();
                    // Odd steps poll in small batches, to exercise the limit.
                    let limit = if delta % 2 == 1 { 3 } else { usize::MAX };
                    while wheel.poll(now, limit, |_, due, id| got.push((due, id))) == limit {}
                    got.sort();
                    let expect: Vec<(u64, u64)> = model.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
                    for k in &expect { model.remove(k); }
                    live.retain(|(due, _, _)| *due > now);
                    prop_assert_eq!(got, expect);
                }
            }
            prop_assert_eq!(wheel.len(), model.len());
        }
        // Everything left pops eventually, at its time.
        let mut got = Vec::new();
        wheel.poll(u64::MAX / 4, usize::MAX, |_, due, id| got.push((due, id)));
        got.sort();
        let expect: Vec<(u64, u64)> = model.keys().copied().collect();
        prop_assert_eq!(got, expect);
        prop_assert!(wheel.is_empty());
    }
}
