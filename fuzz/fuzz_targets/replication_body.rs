//! Replication bodies (seed 000's internal `PUT` with `replicas`): what
//! parses, encodes back and parses again to the same timer.
#![no_main]
use chronos::cluster::replicate::{encode_body, Body};
use chronos::timer::spec::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let check = chronos::http::uri::check;
    let Ok(spec) = parse(data, check) else {
        return;
    };
    let Some(r) = spec.replication.as_ref() else {
        return;
    };
    let replicas: Vec<&str> = r.replicas.iter().map(|s| s.as_ref()).collect();
    let sites: Vec<&str> = r.sites.iter().map(|s| s.as_ref()).collect();
    let tags: Vec<(&str, u32)> = spec.tags.iter().map(|(t, n)| (t.as_ref(), *n)).collect();
    let mut ext = Vec::new();
    if let Some(d) = &spec.delivery {
        d.push_ext(&mut ext);
    }
    // Issue 42: `at`, `start-at` or `cron`, with the absolute start.
    if let Some(t) = &spec.timing {
        t.push_ext(&mut ext, t.start_unix_ms.unwrap_or(0));
    }
    let body = Body {
        interval_ms: spec.interval_ms,
        repeat_for_ms: spec.repeat_for_ms,
        start_time_delta_ms: r.start_time_delta_ms,
        sequence: r.sequence_number,
        version_us: r.version_us.unwrap_or(0),
        uri: &spec.uri,
        opaque: &spec.opaque,
        view_id: 1,
        replicas: &replicas,
        sites: &sites,
        factor_requested: spec.replication_factor.unwrap_or(1),
        tags: &tags,
        start_time_unix_ms: None,
        only_newer: false,
        ext: &ext,
        attempt: r.attempt.as_deref().copied(),
    };
    let mut out = Vec::new();
    encode_body(&mut out, &body);
    let again = parse(&out, check).expect("an encoded body parses");
    assert_eq!(
        (again.interval_ms, again.repeat_for_ms),
        (spec.interval_ms, spec.repeat_for_ms)
    );
    assert_eq!(
        (again.uri.as_ref(), again.opaque.as_ref()),
        (spec.uri.as_ref(), spec.opaque.as_ref())
    );
    assert_eq!(
        again.replication_factor,
        Some(spec.replication_factor.unwrap_or(1))
    );
    let r2 = again.replication.expect("replicas or sites survive");
    assert_eq!(r2.replicas, r.replicas);
    assert_eq!(r2.sites, r.sites);
    assert_eq!(r2.sequence_number, r.sequence_number);
    assert_eq!(r2.start_time_delta_ms, r.start_time_delta_ms);
    assert_eq!(again.delivery, spec.delivery, "the policy survives");
    assert_eq!(r2.attempt, r.attempt, "a pop's attempts survive");
    let timing = |t: Option<&chronos::timer::spec::Timing>| {
        t.map(|t| (t.kind, t.text.to_string(), t.zone.to_string(), t.at_unix_ms, t.start_unix_ms.unwrap_or(0)))
    };
    assert_eq!(
        timing(again.timing.as_deref()),
        timing(spec.timing.as_deref()),
        "the timing survives"
    );
});
