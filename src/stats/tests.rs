use super::*;

/// A reader on another thread never sees every run finished with the
/// state still "running" (it did when the state was read first).
#[test]
fn resync_progress_never_reports_running_once_every_run_finished() {
    let stats = std::sync::Arc::new(ShardStats::default());
    let writer = stats.clone();
    let runs = 200_000;
    let t = std::thread::spawn(move || {
        for _ in 0..runs {
            writer.resync_begin();
            writer.resync_end(RESYNC_COMPLETE);
        }
    });
    let mut torn = 0;
    while !t.is_finished() {
        let (state, started, finished) = stats.resync_progress();
        assert!(finished <= started, "{finished} finished of {started}");
        torn += usize::from(finished == started && state == RESYNC_RUNNING as usize);
    }
    t.join().unwrap();
    assert_eq!(
        torn, 0,
        "reads with every run finished and the state running"
    );
    assert_eq!(
        stats.resync_progress(),
        (RESYNC_COMPLETE as usize, runs, runs)
    );
}

/// A scrape never shows every run started finished with the state
/// still "running" (it could: the runs counter, the state and the
/// finished gauge were read at three moments in any order).
#[test]
fn a_scrape_never_shows_running_once_every_run_finished() {
    use std::sync::atomic::AtomicBool;
    let shards = std::sync::Arc::new([ShardStats::default()]);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (writer, stopped) = (shards.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        while !stopped.load(Relaxed) {
            writer[0].resync_begin();
            writer[0].resync_end(RESYNC_COMPLETE);
        }
    });
    let value = |text: &str, name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..].parse().unwrap()
    };
    let (mut torn, mut out) = (0, String::new());
    for _ in 0..4_000 {
        out.clear();
        render(&shards[..], &[], &[], &mut out);
        let started = value(&out, "chronos_resync_runs_total ");
        let state = value(&out, "chronos_resync_state ");
        let finished = value(&out, "chronos_resync_finished_runs ");
        assert!(finished <= started, "{finished} finished of {started}");
        torn += usize::from(finished == started && state == RESYNC_RUNNING as u64);
    }
    stop.store(true, Relaxed);
    t.join().unwrap();
    assert_eq!(torn, 0, "scrapes with every run finished and running");
}

#[test]
fn a_histogram_counts_by_le_and_renders_cumulative_buckets() {
    let bounds = [10, 100];
    let (a, b) = (Histogram::default(), Histogram::default());
    for us in [0, 10, 11, 100, 101, 5_000] {
        a.record(&bounds, us);
    }
    b.record(&bounds, 50);
    let mut out = String::new();
    series(&mut out, "x_seconds", "k=\"v\"", &bounds, [&a, &b]);
    assert_eq!(
        out,
        "x_seconds_bucket{k=\"v\",le=\"0.00001\"} 2\n\
         x_seconds_bucket{k=\"v\",le=\"0.0001\"} 5\n\
         x_seconds_bucket{k=\"v\",le=\"+Inf\"} 7\n\
         x_seconds_sum{k=\"v\"} 0.005272\n\
         x_seconds_count{k=\"v\"} 7\n"
    );
    let mut out = String::new();
    series(&mut out, "y", "", &bounds, [&b]);
    assert!(out.starts_with("y_bucket{le=\"0.00001\"} 0\n"), "{out}");
    assert!(out.ends_with("y_sum 0.00005\ny_count 1\n"), "{out}");
}
