//! The configuration's unit tests: a file (or variables, or flags) in,
//! a resolved configuration or an error naming the key out.

use super::*;

fn two_node(identity: &str) -> Result<Resolved, String> {
    let text = format!(
            "[cluster]\nlocalhost = \"10.0.0.1:7253\"\nnode = [\"10.0.0.1:7253\", \"10.0.0.2:7253\"]\n[http]\nbind-address = \"10.0.0.1\"\n{identity}"
        );
    Config::from_toml(&text)?.resolve(1)
}

#[test]
fn identity_takes_the_reference_keys_and_refuses_a_collision() {
    let derived = two_node("").unwrap();
    let peer = derived
        .cluster
        .member_instances()
        .into_iter()
        .find(|m| m.0 == "10.0.0.2:7253")
        .unwrap()
        .1;
    assert_eq!(derived.instance_id, derived.cluster.local_instance() as u16);
    let pinned = two_node(&format!(
        "[identity]\ninstance_id = {}\ndeployment_id = 5",
        (peer + 1) % 128
    ))
    .unwrap();
    assert_eq!(pinned.instance_id, 5 * 128 + ((peer as u16 + 1) % 128));
    let clash = two_node(&format!("[identity]\ninstance_id = {peer}")).unwrap_err();
    assert!(
        clash.contains("10.0.0.1:7253") && clash.contains("10.0.0.2:7253"),
        "{clash}"
    );
    for (bad, why) in [
        ("instance_id = 128", "instance_id"),
        ("deployment_id = 8", "deployment_id"),
    ] {
        let e = two_node(&format!("[identity]\n{bad}")).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
}

#[test]
fn the_skew_rule_holds_by_default_and_a_config_that_breaks_it_is_refused() {
    assert!(two_node("").is_ok(), "the defaults keep the rule");
    let e = two_node("[timers]\ncallback-timeout-ms = 2000").unwrap_err();
    assert!(
        e.contains("replica-skew-ms 2000") && e.contains("2500 ms"),
        "{e}"
    );
    let wider = "[timers]\ncallback-timeout-ms = 2000\nreplica-skew-ms = 2500";
    assert!(two_node(wider).is_ok());
    // A single node has no backup to race.
    let single = Config::from_toml("[timers]\ncallback-timeout-ms = 5000").unwrap();
    assert!(single.resolve(1).is_ok());
}

#[test]
fn embedded_default_is_single_node_on_7253() {
    let r = Config::default().resolve(2).unwrap();
    assert_eq!(r.shards, 2);
    assert_eq!(r.cluster.local_address, "127.0.0.1:7253");
    assert_eq!(r.cluster.nodes.len(), 1);
    assert_eq!(r.config.timers.callback_timeout_ms, 1500);
}

#[test]
fn reference_key_names() {
    let c = Config::from_toml(
        r#"
            [http]
            bind-address = "127.0.0.2"
            bind-port = 9000
            [runtime]
            cores = 1
            [cluster]
            localhost = "127.0.0.2:9000"
            node = ["127.0.0.1:9000", "127.0.0.2:9000"]
            joining = ["127.0.0.3:9000"]
            leaving = []
            [timers]
            callback-timeout-ms = 500
            "#,
    )
    .unwrap();
    let r = c.resolve(2).unwrap();
    assert_eq!(r.shards, 1);
    assert_eq!(r.cluster.nodes.len(), 3);
    assert_eq!(r.cluster.local, Some(1));
    assert_eq!(r.config.timers.callback_timeout_ms, 500);
}

#[test]
fn sample_config_is_valid_and_matches_defaults() {
    let text = include_str!("../../chronos.sample.toml");
    let c = Config::from_toml(text).unwrap();
    let d = Config::default();
    assert_eq!(c.http.body_bytes_max, d.http.body_bytes_max);
    assert_eq!(
        c.timers.callback_connections_per_host_max,
        d.timers.callback_connections_per_host_max
    );
    assert_eq!(c.timers.timers_per_shard_max, d.timers.timers_per_shard_max);
    assert_eq!(c.http.accept_steering, d.http.accept_steering);
    assert_eq!(c.http.net_ring, d.http.net_ring);
    assert_eq!(c.http.write_timeout_ms, d.http.write_timeout_ms);
    c.resolve(2).unwrap();
}

#[test]
fn a_queue_section_with_defaults_is_valid() {
    let text = "[queue]\nkafka-brokers = \"127.0.0.1:9092\"\ninput-topic = \"in\"\noutput-topic = \"out\"\npostgres-url = \"postgres://postgres@127.0.0.1:5432/test\"\n[queue.consumer]\n\"session.timeout.ms\" = 6000\n";
    let r = Config::from_toml(text).unwrap().resolve(2).unwrap();
    let q = r.config.queue.unwrap();
    assert_eq!(q.table, "chronos_messages");
    assert_eq!(
        (
            q.timing_advance_ms,
            q.hold_time_ms,
            q.poll_interval_ms,
            q.failure_detection_interval_ms
        ),
        (50, 5000, 100, 500)
    );
    assert_eq!(
        QueueConfig::property(&q.consumer["session.timeout.ms"]),
        "6000"
    );
}

#[test]
fn invalid_configs_fail_clearly() {
    let table = [
            ("[http]\nbind-port = \"x\"", "bind-port"),
            ("[http]\nbogus = 1", "bogus"),
            ("[http]\naccept-steering = \"round-robin\"", "cpu"),
            ("[runtime]\ncores = 0", "cores"),
            ("[runtime]\ncores = 99", "cores"),
            ("[http]\nbind-address = \"nope\"", "bind-address"),
            ("[cluster]\nnode = [\"10.0.0.9:1\"]", "not in the cluster"),
            ("[timers]\ncallback-timeout-ms = 0", "callback-timeout-ms"),
            ("[http]\nwrite-timeout-ms = 0", "write-timeout-ms"),
            ("[log]\nlevel = \"verbose\"", "\"verbose\" is not a level"),
            ("[log]\nlevel = \"info,warning\"", "\"warning\" is not a level"),
            ("[log]\nlevel = \"chronos=loud\"", "[log] level"),
            (
                "[timers]\ncallback-in-flight-per-target-max = 5000",
                "callback-in-flight-per-target-max = 5000",
            ),
            ("[cluster]\nreplication-queue-max = 0", "replication-queue-max"),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"postgres://u@h:5432/d\"\ntable = \"x; drop\"",
                "plain SQL identifier",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"postgres://u@h:5432/d\"\nlook-ahead-ms = 5000",
                "look-ahead-ms",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"a\"\npostgres-url = \"postgres://u@h:5432/d\"",
                "must differ",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"host=/var/run/postgresql\"",
                "TCP host",
            ),
            ("[queue]\nkafka-brokers = \"k:1\"", "missing field"),
        ];
    for (text, needle) in table {
        let err = Config::from_toml(text)
            .and_then(|c| c.resolve(2))
            .expect_err(text);
        assert!(err.contains(needle), "{text:?} gave {err:?}");
    }
}

#[test]
fn flags_override_env_override_file() {
    let args: Vec<String> = ["--bind-port", "8001", "--cores=1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cli = Cli::parse_from(&args, vars(&[("CHRONOS_BIND_PORT", "8000")])).unwrap();
    let r = Config::load(&cli, 2).unwrap();
    assert_eq!(r.config.http.bind_port, 8001);
    assert_eq!(r.shards, 1);
    assert!(Cli::parse_from(&["--what".to_string()], vars(&[])).is_err());
}

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load_with(list: &[(&str, &str)]) -> Result<Resolved, String> {
    Config::load(&Cli::parse_from(&[], vars(list))?, 2)
}

#[test]
fn every_key_has_a_variable_by_the_rule() {
    let r = load_with(&[
        ("CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS", "1000"),
        ("CHRONOS_HTTP_BIND_ADDRESS", "127.0.0.2"),
        ("CHRONOS_HTTP_NET_RING", "false"),
        (
            "CHRONOS_CLUSTER_NODE",
            "[\"127.0.0.2:7253\", \"127.0.0.3:7253\"]",
        ),
        ("CHRONOS_SITES_LOCAL_SITE", "east"),
        ("CHRONOS_THROTTLING_MAX_TOKENS", "7"),
        ("CHRONOS_IDENTITY_DEPLOYMENT_ID", "3"),
        ("CHRONOS_LOG_LEVEL", "warn"),
        ("CHRONOS_RUNTIME_CORES", "1"),
    ])
    .unwrap();
    let c = &r.config;
    assert_eq!(c.timers.callback_timeout_ms, 1000);
    assert_eq!(c.http.bind_address, "127.0.0.2");
    assert!(!c.http.net_ring);
    assert_eq!(r.cluster.nodes.len(), 2);
    assert_eq!(r.sites.local, "east");
    assert_eq!(c.throttling.as_ref().map(|t| t.max_tokens), Some(7));
    assert_eq!(c.identity.deployment_id, 3);
    assert_eq!((c.log.level.as_str(), r.shards), ("warn", 1));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // The queue's keys together make the section.
    let q = load_with(&[
        ("CHRONOS_QUEUE_KAFKA_BROKERS", "127.0.0.1:9092"),
        ("CHRONOS_QUEUE_INPUT_TOPIC", "123"),
        ("CHRONOS_QUEUE_OUTPUT_TOPIC", "out"),
        ("CHRONOS_QUEUE_POSTGRES_URL", "postgres://u@h:5432/d"),
    ])
    .unwrap();
    assert_eq!(q.config.queue.unwrap().input_topic, "123");
}

#[test]
fn a_bad_variable_is_refused_by_its_name_and_value() {
    for (name, value, wanted) in [
            ("CHRONOS_BIND_PORT", "abc", "CHRONOS_BIND_PORT = \"abc\": [http] bind-port"),
            ("CHRONOS_HTTP_BIND_PORT", "70000", "CHRONOS_HTTP_BIND_PORT = \"70000\""),
            ("CHRONOS_HTTP_NET_RING", "maybe", "CHRONOS_HTTP_NET_RING"),
            (
                "CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS",
                "0",
                "[timers] callback-timeout-ms = 0: must be positive (set by CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS = 0)",
            ),
            ("CHRONOS_LOG_LEVEL", "verbose", "(set by CHRONOS_LOG_LEVEL = \"verbose\")"),
        ] {
            let e = load_with(&[(name, value)]).unwrap_err();
            assert!(e.contains(wanted) && !e.contains("--"), "{name}={value}: {e}");
        }
    let e = load_with(&[("CHRONOS_BIND_PORT", "1"), ("CHRONOS_HTTP_BIND_PORT", "2")]).unwrap_err();
    assert!(e.contains("both set [http] bind-port"), "{e}");
    let args = ["--bind-port".to_string(), "x".to_string()];
    let e = Config::load(&Cli::parse_from(&args, vars(&[])).unwrap(), 2).unwrap_err();
    assert!(
        e.starts_with("--bind-port = \"x\": [http] bind-port"),
        "{e}"
    );
}

#[test]
fn a_secret_set_by_a_variable_never_shows() {
    let e = load_with(&[("CHRONOS_CLUSTER_SHARED_SECRET", "short-one")]).unwrap_err();
    assert!(
        e.contains("[cluster] shared-secret") && e.contains("<redacted>"),
        "{e}"
    );
    assert!(!e.contains("short-one"), "{e}");
    let secret = "a-long-enough-secret-value";
    let r = load_with(&[("CHRONOS_CLUSTER_SHARED_SECRET", secret)]).unwrap();
    assert_eq!(r.config.cluster.shared_secret, Some(Secret::new(secret)));
    let cli = Cli::parse_from(&[], vars(&[("CHRONOS_CLUSTER_SHARED_SECRET", secret)]));
    for shown in [format!("{r:?}"), format!("{cli:?}")] {
        assert!(!shown.contains(secret), "{shown}");
    }
}

#[test]
fn an_unknown_variable_is_a_warning() {
    let r = load_with(&[
        ("CHRONOS_TIMERS_CALLBACK_TIMEOUT", "5"),
        ("CHRONOS_BOGUS", "1"),
        ("CHRONOS_CONFIG_FILE", "x"),
        ("OTHER_VARIABLE", "1"),
    ])
    .unwrap();
    let w = r.warnings.join("\n");
    assert_eq!(r.warnings.len(), 3, "{w}");
    assert!(w.contains("CHRONOS_TIMERS_CALLBACK_TIMEOUT is not a setting: [timers] has no key \"callback-timeout\""), "{w}");
    assert!(
        w.contains("CHRONOS_BOGUS is not a setting: no section \"bogus\""),
        "{w}"
    );
    assert_eq!(r.config.timers.callback_timeout_ms, 1500);
}

#[test]
fn validation_names_the_key_and_the_value() {
    for (text, wanted) in [
            ("[throttling]\ninitial_token_rate = 0", "[throttling] initial_token_rate = 0: must be positive"),
            ("[throttling]\nmax_tokens = 0", "[throttling] max_tokens = 0: must be positive"),
            ("[throttling]\nmin_token_rate = 20\nmax_token_rate = 10", "[throttling] max_token_rate = 10 is below min_token_rate = 20"),
            ("[timers]\ndefault-replication-factor = 0", "[timers] default-replication-factor = 0: must be positive"),
            ("[timers]\ntimers-per-shard-max = 0", "[timers] timers-per-shard-max = 0: must be positive"),
            ("[http]\nheader-bytes-max = 100", "[http] header-bytes-max = 100: must be at least 512"),
            ("[http]\nidle-timeout-ms = 0", "[http] idle-timeout-ms = 0"),
            ("[cluster]\nreplication-queue-bytes-max = 5", "[cluster] replication-queue-bytes-max = 5"),
            ("[cluster]\nresync-page-timers = 0", "[cluster] resync-page-timers = 0"),
            ("[cluster]\nreplication-deliver-within-ms = 10", "[cluster] replication-deliver-within-ms = 10: must be at least replication-timeout-ms = 2000"),
            ("[sites]\nlocal_site = \"a\"\nsite_timeout_ms = 0", "[sites] site_timeout_ms = 0"),
        ] {
            let e = Config::from_toml(text).and_then(|c| c.resolve(2)).unwrap_err();
            assert!(e.contains(wanted), "{text:?} gave {e:?}");
            // One key per message: no other key of the section is named.
            assert!(!e.contains(" and "), "{text:?} gave {e:?}");
        }
    let e = Config::from_toml("[runtime]\ncores = 9").and_then(|c| c.resolve(2));
    let e = e.unwrap_err();
    assert!(
        e.contains("[runtime] cores = 9: must be between 1 and the 2 available cores"),
        "{e}"
    );
    let ok = "[throttling]\ninitial_token_rate = 1\nmin_token_rate = 1";
    assert!(Config::from_toml(ok).unwrap().resolve(2).is_ok());
}

#[test]
fn a_sites_section_must_name_the_local_site() {
    let e = Config::from_toml("[sites]\nremote_site = [\"b=10.0.0.2\"]")
        .and_then(|c| c.resolve(2))
        .unwrap_err();
    assert!(e.contains("[sites] local_site is missing"), "{e}");
    let r = Config::default().resolve(2).unwrap();
    assert_eq!(r.sites.local, DEFAULT_SITE);
    let r = Config::from_toml("[sites]\nlocal_site = \"east\"")
        .unwrap()
        .resolve(2)
        .unwrap();
    assert_eq!(r.sites.local, "east");
}

#[test]
fn signing_keys_are_checked_by_place_and_never_shown() {
    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let resolve = |value: &str| {
        let text = format!("[timers]\ncallback-signing-keys = {value}\n");
        Config::from_toml(&text).and_then(|c| c.resolve(1))
    };
    let none = resolve("[]").expect("no keys");
    assert!(none.signing_keys.is_none(), "an empty list signs nothing");
    let unset = Config::from_toml("").unwrap().resolve(1).unwrap();
    assert!(unset.signing_keys.is_none(), "no key set signs nothing");
    let two = resolve(&format!("[{KEY:?}, {KEY:?}]")).expect("two keys");
    assert_eq!(
        two.signing_keys.as_ref().map(|k| k.len()),
        Some(2),
        "two keys"
    );
    let one = resolve(&format!("{KEY:?}")).expect("a lone string is one key");
    assert_eq!(one.signing_keys.map(|k| k.len()), Some(1), "one key");
    let shown = format!("{two:?}");
    assert!(
        !shown.contains("MfKQ9r8"),
        "Debug never shows a key: {shown}"
    );
    for (value, want) in [
        (
            format!("[{KEY:?}, \"whsec_c2hvcnQ=\"]"),
            "signing key 1: 5 bytes",
        ),
        (format!("[{KEY:?}, 5]"), "must be a list of strings"),
        (
            "{ a = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\" }".into(),
            "must be a list",
        ),
    ] {
        let e = resolve(&value).expect_err(want);
        assert!(
            e.contains("[timers] callback-signing-keys") && e.contains(want),
            "{e}"
        );
        assert!(
            !e.contains("MfKQ9r8") && !e.contains("c2hvcnQ"),
            "never quoted: {e}"
        );
    }
}
