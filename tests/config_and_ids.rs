//! DoD4 (named, validated configuration) and validation of everything that comes from the network.

use std::time::Duration;

use worker_registry::config::{
    DEFAULT_BRAKE_FRACTION, DEFAULT_BRAKE_MIN_WORKERS, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_MISSED_HEARTBEATS, DEFAULT_SWEEP_INTERVAL,
};
use worker_registry::{
    ConfigError, DeliveryId, DeliveryIdError, FencingToken, RegistryConfig, Target, TargetError,
    WorkerId, WorkerIdError,
};

#[test]
fn defaults_follow_the_worker_pool_document() {
    let c = RegistryConfig::default();
    assert_eq!(c.heartbeat_interval(), Duration::from_secs(30));
    assert_eq!(c.heartbeat_interval(), DEFAULT_HEARTBEAT_INTERVAL);
    assert_eq!(c.missed_heartbeats(), DEFAULT_MISSED_HEARTBEATS);
    assert_eq!(
        c.heartbeat_timeout(),
        Duration::from_secs(120),
        "stale after 2 min"
    );
    assert_eq!(c.sweep_interval(), DEFAULT_SWEEP_INTERVAL);
    assert_eq!(
        c.max_in_flight(),
        Duration::from_secs(30 * 60),
        "the pool's stale-task age"
    );
    assert_eq!(
        (c.brake_fraction(), c.brake_min_workers()),
        (0.5, 3),
        "the brake: more than half of at least three (Kubernetes' unhealthy-zone rule)"
    );
    assert_eq!(DEFAULT_BRAKE_FRACTION, 0.5);
    assert_eq!(DEFAULT_BRAKE_MIN_WORKERS, 3);
    assert_eq!(
        RegistryConfig::builder().build(),
        Ok(c),
        "the defaults pass the builder's validation"
    );
}

#[test]
fn a_configuration_cannot_bypass_validation() {
    // Every way to get a config goes through the builder: shards that dashmap would panic on,
    // a single missed heartbeat, and durations absurd enough to overflow sums are all refused.
    assert_eq!(
        field_of(RegistryConfig::builder().shards(3).build().unwrap_err()),
        "shards"
    );
    assert_eq!(
        field_of(
            RegistryConfig::builder()
                .missed_heartbeats(0)
                .build()
                .unwrap_err()
        ),
        "missed_heartbeats"
    );
    assert_eq!(
        field_of(
            RegistryConfig::builder()
                .claim_retention(Duration::MAX)
                .build()
                .unwrap_err()
        ),
        "claim_retention"
    );
    let huge = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(200 * 24 * 3600))
        .missed_heartbeats(4)
        .sweep_interval(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert_eq!(field_of(huge), "heartbeat_interval x missed_heartbeats");
    assert_eq!(
        field_of(
            RegistryConfig::builder()
                .max_in_flight(Duration::ZERO)
                .build()
                .unwrap_err()
        ),
        "max_in_flight"
    );
}

fn field_of(err: ConfigError) -> &'static str {
    match err {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn builder_rejects_each_invalid_setting_naming_the_field_and_value() {
    let b = RegistryConfig::builder;
    let cases: Vec<(&str, Result<RegistryConfig, ConfigError>)> = vec![
        ("missed_heartbeats", b().missed_heartbeats(1).build()),
        (
            "heartbeat_interval",
            b().heartbeat_interval(Duration::ZERO).build(),
        ),
        ("sweep_interval", b().sweep_interval(Duration::ZERO).build()),
        (
            "sweep_interval",
            b().sweep_interval(Duration::from_secs(121)).build(),
        ),
        ("max_workers", b().max_workers(0).build()),
        (
            "claim_retention",
            b().claim_retention(Duration::from_secs(1)).build(),
        ),
        ("max_retained_claims", b().max_retained_claims(0).build()),
        (
            "dead_retention",
            b().dead_retention(Duration::from_secs(1)).build(),
        ),
        ("brake_fraction", b().brake_fraction(0.0).build()),
        ("brake_fraction", b().brake_fraction(1.5).build()),
        ("brake_fraction", b().brake_fraction(f64::NAN).build()),
        ("brake_min_workers", b().brake_min_workers(0).build()),
        (
            "suspect_grace",
            b().suspect_grace(Duration::from_millis(1)).build(),
        ),
        ("shards", b().shards(3).build()),
    ];
    for (field, result) in cases {
        let err = result.expect_err(field);
        let text = err.to_string();
        assert_eq!(field_of(err), field, "{text}");
        assert!(text.contains(field), "{text}");
    }
    let err = b().missed_heartbeats(1).build().unwrap_err();
    assert!(
        err.to_string().contains(": 1;"),
        "carries the value seen: {err}"
    );
}

#[test]
fn targets_are_validated_and_normalised() {
    assert_eq!(
        Target::new("Octo/Repo", 3).unwrap(),
        Target::new("octo/repo", 3).unwrap()
    );
    assert_eq!("a/b#7".parse::<Target>().unwrap().number(), 7);
    assert_eq!("a/b#7".parse::<Target>().unwrap().repo(), "a/b");
    let cases = [
        ("", 1),
        ("noslash", 1),
        ("/name", 1),
        ("owner/", 1),
        ("a/b/c", 1),
        ("a/..", 1),
        ("own er/name", 1),
        ("owner/na me", 1),
        ("owner/näme", 1),
        ("a/b", 0),
    ];
    for (repo, n) in cases {
        assert!(Target::new(repo, n).is_err(), "{repo:?}#{n} accepted");
    }
    assert_eq!(
        Target::new(&format!("{}/r", "o".repeat(40)), 1),
        Err(TargetError::TooLong {
            part: "owner",
            len: 40,
            max: 39
        })
    );
    assert!(Target::new(&format!("o/{}", "r".repeat(100)), 1).is_ok());
    assert!(matches!(
        Target::new(&format!("o/{}", "r".repeat(101)), 1),
        Err(TargetError::TooLong { len: 101, .. })
    ));
    assert_eq!(
        Target::new("o/r$", 1),
        Err(TargetError::BadCharacter {
            part: "repository name",
            found: '$'
        })
    );
    for s in ["a/b", "a/b#", "a/b#x", "a/b#-1", "#1"] {
        assert!(s.parse::<Target>().is_err(), "{s:?} parsed");
    }
}

#[test]
fn event_ids_are_validated() {
    assert_eq!(DeliveryId::new(""), Err(DeliveryIdError::Empty));
    assert!(DeliveryId::new(&"x".repeat(255)).is_ok());
    assert_eq!(
        DeliveryId::new(&"x".repeat(256)),
        Err(DeliveryIdError::TooLong { len: 256, max: 255 })
    );
    assert_eq!(
        DeliveryId::new("a\nb"),
        Err(DeliveryIdError::BadByte { found: b'\n' })
    );
    assert!(DeliveryId::new("é").is_err());
}

#[test]
fn worker_ids_parse_or_say_what_they_got() {
    assert_eq!("17".parse::<WorkerId>().unwrap(), WorkerId::new(17));
    let err = "abc".parse::<WorkerId>().unwrap_err();
    assert_eq!(
        err,
        WorkerIdError::NotANumber {
            input: "abc".into()
        }
    );
    for refused in ["-1", "+1", "01", "", " 1", "1 ", "18446744073709551616"] {
        assert!(refused.parse::<WorkerId>().is_err(), "{refused:?}");
    }
    assert_eq!(
        (WorkerId::MAX + 1).to_string().parse::<WorkerId>(),
        Err(WorkerIdError::OutOfRange {
            id: WorkerId::MAX + 1
        })
    );
    assert_eq!("0".parse::<WorkerId>(), Ok(WorkerId::new(0)));
}

#[test]
fn tokens_order_by_worker_then_sequence_saturate_and_refuse_ids_that_do_not_fit() {
    let a = FencingToken::new(WorkerId::new(1), u64::MAX).unwrap();
    assert_eq!(
        a.seq(),
        FencingToken::MAX_SEQ,
        "saturates instead of spilling"
    );
    assert_eq!(a.worker(), WorkerId::new(1));
    assert!(FencingToken::new(WorkerId::new(2), 1).unwrap() > a);
    let top = FencingToken::new(WorkerId::new(WorkerId::MAX), 1).unwrap();
    assert_eq!(top.worker(), WorkerId::new(WorkerId::MAX), "no truncation");
    assert_eq!(
        FencingToken::new(WorkerId::new(WorkerId::MAX + 1), 1),
        Err(WorkerIdError::OutOfRange {
            id: WorkerId::MAX + 1
        })
    );
}
