//! Bad input: arbitrary strings, bytes and lengths fed to every constructor that takes network input
//! (`Target::new`, `Target::from_str`, `DeliveryId::new`, `WorkerId::from_str`, `Payload::builder`),
//! payloads of every size to `admit_with`, and arbitrary worker ids fed to every registry call that
//! takes one. Every call returns a value or a typed error (a panic
//! fails the property), and each error carries exactly what was observed.

use std::collections::BTreeSet;
use std::str::FromStr;

use proptest::prelude::*;
use worker_registry::limits::{
    MAX_CONTENT_TYPE_LEN, MAX_DELIVERY_ID_LEN, MAX_EVENT_NAME_LEN, MAX_HEADER_NAME_LEN,
    MAX_HEADER_VALUE_LEN, MAX_OWNER_LEN, MAX_PAYLOAD_HEADERS, MAX_PAYLOAD_META_LEN,
    MAX_REPO_NAME_LEN,
};
use worker_registry::{
    memory::Direct, Admission, ClaimOutcome, DeliveryId, DeliveryIdError, HeartbeatAck,
    ManualClock, Payload, PayloadError, RegistryConfig, RegistryError, Target, TargetError,
    WorkerId, WorkerIdError,
};

// ---- input generators ----------------------------------------------------------------------------

/// A string strategy from a regex, compiled once (a bare `&str` strategy recompiles per value).
fn re(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
    proptest::string::string_regex(pattern).unwrap()
}

/// Text that is sometimes valid and often almost valid: right alphabet with stray characters, lengths
/// around every limit, unicode, controls, separators.
fn nasty_text() -> impl Strategy<Value = String> {
    prop_oneof![
        // Anything at all, including non-ASCII and control characters.
        any::<String>(),
        // Arbitrary bytes made into text (invalid UTF-8 becomes U+FFFD).
        proptest::collection::vec(any::<u8>(), 0..400)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        // Near-valid repository names with lengths straddling the owner and name limits.
        (
            prop_oneof![
                re("[A-Za-z0-9-]{0,42}"),
                re("[A-Za-z0-9_-]{0,20}"),
                re("[a-z-]{1,8}_[A-Za-z0-9-]{0,8}")
            ],
            re("[A-Za-z0-9._-]{0,104}"),
            prop_oneof![Just("/"), Just("//"), Just(""), Just("#"), Just(" / ")],
        )
            .prop_map(|(o, n, sep)| format!("{o}{sep}{n}")),
        // Near-valid delivery ids with lengths straddling the limit.
        re("[!-~]{250,260}"),
        re("[ -~\\t\\n\\x00\\x7f]{0,20}"),
        Just(String::new()),
    ]
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(u64::MAX), any::<u64>()]
}

// ---- what a valid value looks like (the documented rules, restated) --------------------------------

fn owner_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_')
}

/// A login (letters, digits, hyphens, not starting with a hyphen), optionally followed by `_` and
/// an Enterprise Managed User short code (letters and digits).
fn owner_shape(o: &str) -> bool {
    let (base, code) = o.split_once('_').unwrap_or((o, "x"));
    !base.is_empty()
        && !base.starts_with('-')
        && base.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !code.is_empty()
        && code.chars().all(|c| c.is_ascii_alphanumeric())
}

fn valid_owner(o: &str) -> bool {
    !o.is_empty() && o.len() <= MAX_OWNER_LEN && o.chars().all(owner_char) && owner_shape(o)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_REPO_NAME_LEN
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && n != "."
        && n != ".."
}

fn valid_repo(r: &str) -> bool {
    match r.split_once('/') {
        Some((o, n)) => valid_owner(o) && valid_name(n),
        None => false,
    }
}

fn valid_event(e: &str) -> bool {
    !e.is_empty() && e.len() <= MAX_DELIVERY_ID_LEN && e.bytes().all(|b| b.is_ascii_graphic())
}

/// A bounded prefix of `input` (as errors keep it), cut on a character boundary.
fn is_bounded_prefix(observed: &str, input: &str, max: usize) -> bool {
    observed.len() <= max
        && input.starts_with(observed)
        && (observed.len() == input.len() || observed.len() + 4 > max)
}

/// Checks a `TargetError` against the repository text and number that produced it.
fn check_target_error(err: &TargetError, repo: &str, number: u64) {
    let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
    match err {
        TargetError::NotOwnerSlashName { input } => {
            assert!(is_bounded_prefix(input, repo, 160), "{input:?} vs {repo:?}");
            assert!(
                !repo.contains('/')
                    || owner.is_empty()
                    || name.is_empty()
                    || name.contains('/')
                    || name == "."
                    || name == "..",
                "{repo:?} has the owner/name shape"
            );
        }
        TargetError::TooLong { part, len, max } => match *part {
            "owner" => assert_eq!((*len, *max), (owner.len(), MAX_OWNER_LEN)),
            "repository name" => assert_eq!((*len, *max), (name.len(), MAX_REPO_NAME_LEN)),
            other => panic!("unknown part {other:?}"),
        },
        TargetError::BadCharacter { part, found } => {
            let (text, ok): (&str, fn(char) -> bool) = match *part {
                "owner" => (owner, owner_char),
                "repository name" => (name, |c| {
                    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
                }),
                other => panic!("unknown part {other:?}"),
            };
            assert_eq!(
                text.chars().find(|c| !ok(*c)),
                Some(*found),
                "the first bad character of {text:?}"
            );
        }
        TargetError::BadOwner { owner: seen, .. } => {
            assert_eq!(seen, owner);
            assert!(
                owner.chars().all(owner_char) && !owner_shape(owner),
                "{owner:?}"
            );
        }
        TargetError::ZeroNumber => {
            assert_eq!(number, 0);
            assert!(valid_repo(repo), "the repository is checked first");
        }
        other => panic!("Target::new gave {other:?}"),
    }
    let shown = err.to_string();
    assert!(!shown.is_empty());
    if let TargetError::TooLong { len, .. } = err {
        assert!(shown.contains(&len.to_string()), "{shown}");
    }
}

// ---- properties ------------------------------------------------------------------------------------

mod proptest_support;
use proptest_support::proptest_config;

proptest! {
    #![proptest_config(proptest_config(256))]

    /// `Target::new` accepts exactly GitHub's `owner/name` with a number of at least 1, and every
    /// refusal says which rule was broken with what it saw.
    #[test]
    fn target_new_never_panics_and_explains_refusals(repo in nasty_text(), n in number()) {
        match Target::new(&repo, n) {
            Ok(t) => {
                prop_assert!(valid_repo(&repo) && n >= 1, "accepted {repo:?}#{n}");
                prop_assert_eq!(t.repo(), repo.to_ascii_lowercase());
                prop_assert_eq!(t.number(), n);
                // Display and FromStr round-trip, case-insensitively.
                prop_assert_eq!(Target::from_str(&t.to_string()), Ok(t.clone()));
                prop_assert_eq!(Target::new(&repo.to_ascii_uppercase(), n), Ok(t));
            }
            Err(e) => {
                prop_assert!(!(valid_repo(&repo) && n >= 1), "refused valid {repo:?}#{n}: {e}");
                check_target_error(&e, &repo, n);
            }
        }
    }

    /// `Target::from_str` on arbitrary text, and on `repo#number` built from arbitrary parts.
    #[test]
    fn target_from_str_never_panics(s in nasty_text(), repo in nasty_text(), n in number()) {
        match Target::from_str(&s) {
            Ok(t) => {
                let (r, num) = s.rsplit_once('#').unwrap();
                prop_assert_eq!(t.repo(), r.to_ascii_lowercase());
                prop_assert_eq!(Ok(t.number()), num.parse::<u64>());
            }
            Err(TargetError::MissingNumber { input }) => {
                prop_assert!(is_bounded_prefix(&input, &s, 160));
                prop_assert!(s.rsplit_once('#').is_none_or(|(_, num)| num.parse::<u64>().is_err()));
            }
            Err(e) => {
                let (r, num) = s.rsplit_once('#').unwrap();
                check_target_error(&e, r, num.parse().unwrap());
            }
        }
        let joined = format!("{repo}#{n}");
        prop_assert_eq!(Target::from_str(&joined), Target::new(&repo, n));
    }

    /// `DeliveryId::new`: exactly non-empty visible ASCII of at most 255 bytes; refusals carry the length
    /// or the first offending byte.
    #[test]
    fn event_id_never_panics_and_explains_refusals(s in nasty_text()) {
        match DeliveryId::new(&s) {
            Ok(e) => {
                prop_assert!(valid_event(&s));
                prop_assert_eq!(e.as_str(), s.as_str());
                prop_assert_eq!(e.to_string(), s.clone());
                prop_assert_eq!(DeliveryId::from_str(&s), Ok(e));
            }
            Err(err) => {
                prop_assert!(!valid_event(&s));
                match &err {
                    DeliveryIdError::Empty => prop_assert!(s.is_empty()),
                    DeliveryIdError::TooLong { len, max } => {
                        prop_assert_eq!((*len, *max), (s.len(), MAX_DELIVERY_ID_LEN));
                    }
                    DeliveryIdError::BadByte { found } => {
                        prop_assert!(!s.is_empty() && s.len() <= MAX_DELIVERY_ID_LEN);
                        prop_assert_eq!(Some(*found), s.bytes().find(|b| !b.is_ascii_graphic()));
                        let hex = format!("0x{found:02x}");
                        prop_assert!(err.to_string().contains(&hex), "{} lacks {}", err, hex);
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
        }
    }

    /// `WorkerId::from_str` accepts exactly the canonical decimals up to `WorkerId::MAX` and keeps
    /// (a bounded prefix of) the rejected text. The generators reach the accept path (any id up
    /// to MAX), the bound itself (MAX and MAX + 1), both sides of it (MAX - 1000 ..= MAX + 1000,
    /// and 13-15 digit strings: MAX has 14 digits) and the `u64` overflow (18-22 digits).
    #[test]
    fn worker_id_parse_never_panics(s in prop_oneof![
        nasty_text(),
        any::<u64>().prop_map(|n| n.to_string()),
        (0..=WorkerId::MAX).prop_map(|n| n.to_string()),
        (WorkerId::MAX - 1000..=WorkerId::MAX + 1000).prop_map(|n| n.to_string()),
        prop_oneof![Just(WorkerId::MAX), Just(WorkerId::MAX + 1)].prop_map(|n| n.to_string()),
        re("[+-]?0?[0-9]{13,15}"),
        re("[+-]?[0-9]{18,22}"),
    ]) {
        // Canonical decimal only: digits, no sign, no leading zero, at most WorkerId::MAX.
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        match (WorkerId::from_str(&s), s.parse::<u64>()) {
            (Ok(id), Ok(n)) => {
                prop_assert!(canonical && n <= WorkerId::MAX, "{s:?} accepted");
                prop_assert_eq!(id.get(), n);
                prop_assert_eq!(WorkerId::from_str(&id.to_string()), Ok(id));
            }
            (Err(WorkerIdError::OutOfRange { id }), Ok(n)) => {
                prop_assert!(canonical && n > WorkerId::MAX && id == n, "{s:?}");
            }
            (Err(WorkerIdError::NotANumber { input }), _) => {
                prop_assert!(!canonical || s.parse::<u64>().is_err(), "{s:?} refused");
                prop_assert!(is_bounded_prefix(&input, &s, 64), "{input:?} vs {s:?}");
            }
            (a, b) => prop_assert!(false, "{a:?} vs {b:?}"),
        }
    }

    /// Every registry call that takes a worker id, with any id at all: the live ones answer, every
    /// other id is `UnknownWorker` carrying that id, and nothing changes.
    #[test]
    fn registry_calls_with_arbitrary_worker_ids_never_panic(
        raws in proptest::collection::vec(prop_oneof![0u64..8, any::<u64>(), Just(u64::MAX)], 1..32)
    ) {
        let registry = Direct::with_clock(
            RegistryConfig::builder().max_workers(4).build().unwrap(),
            ManualClock::new(),
        );
        let Admission::Assigned(a) = registry.admit(
            &Target::new("o/r", 1).unwrap(),
            &DeliveryId::new("e").unwrap(),
        ) else { unreachable!() };
        let pool = registry.register().unwrap();
        let known: BTreeSet<WorkerId> = [a.worker, pool.id()].into();
        for raw in raws {
            let id = WorkerId::new(raw);
            if known.contains(&id) {
                prop_assert!(registry.heartbeat(id).is_ok());
                prop_assert!(registry.worker(id).is_some());
                continue;
            }
            let unknown = RegistryError::UnknownWorker { id };
            prop_assert_eq!(registry.heartbeat(id), Err(unknown.clone()));
            prop_assert_eq!(registry.loop_started(id), Err(unknown.clone()));
            prop_assert_eq!(registry.loop_finished(id), Err(unknown.clone()));
            prop_assert_eq!(registry.drain(id), Err(unknown.clone()));
            prop_assert_eq!(registry.deregister(id), Err(unknown.clone()));
            prop_assert_eq!(registry.handle(id).map(|h| h.id()).err(), Some(unknown.clone()));
            prop_assert_eq!(registry.worker(id), None);
            prop_assert!(unknown.to_string().contains(&raw.to_string()));
            prop_assert_eq!(unknown.observed_status(), None);
        }
        // Nothing the unknown ids did touched the real workers.
        prop_assert_eq!(registry.live_workers(), 2);
        prop_assert_eq!(registry.heartbeat(a.worker), Ok(HeartbeatAck::Active));
        prop_assert_eq!(pool.heartbeat(), Ok(HeartbeatAck::Active));
        let stats = registry.stats();
        prop_assert_eq!(stats.deaths_exited + stats.deaths_deregistered, 0);
    }

    /// Whatever survives validation goes through every claim and assignment call; every answer is a
    /// value or a typed error naming the pair, and a rejected delivery leaves no claim behind.
    #[test]
    fn registry_calls_with_arbitrary_validated_input_never_panic(
        inputs in proptest::collection::vec(
            (
                // Two thirds of the inputs are valid, over a small key space (so that duplicates,
                // sticky assignments and capacity rejections all happen), the rest arbitrary.
                prop_oneof![1 => nasty_text(), 2 => re("[a-c]{1,2}/[a-c.]{1,2}")],
                prop_oneof![number(), 0u64..4],
                prop_oneof![1 => nasty_text(), 2 => re("[a-c0-9]{1,2}")],
            ),
            1..32,
        )
    ) {
        let registry = Direct::with_clock(
            RegistryConfig::builder().max_workers(2).build().unwrap(),
            ManualClock::new(),
        );
        for (repo, n, event) in inputs {
            // Invalid input never reaches the registry: it is refused at the boundary.
            let (Ok(t), Ok(e)) = (Target::new(&repo, n), DeliveryId::new(&event)) else { continue };
            let before = registry.claim_count();
            match registry.admit(&t, &e) {
                Admission::Assigned(a) => {
                    prop_assert_eq!(a.token.worker(), a.worker);
                    prop_assert_eq!(registry.worker(a.worker).unwrap().target, Some(t.clone()));
                }
                Admission::Duplicate(_) => {}
                // The waiting room is off in this registry.
                Admission::Waiting(w) => prop_assert!(false, "parked with the room off: {w:?}"),
                Admission::Rejected(_) => {
                    prop_assert_eq!(registry.claim_count(), before, "a rejection left a claim");
                    prop_assert_eq!(
                        registry.release(&t, &e),
                        Err(RegistryError::UnknownClaim { target: t.clone(), delivery: e.clone() })
                    );
                    continue;
                }
            }
            prop_assert!(matches!(registry.claim(&t, &e), ClaimOutcome::AlreadyClaimed(_)));
            prop_assert_eq!(registry.complete(&t, &e), Ok(()));
            let completed = RegistryError::ClaimCompleted { target: t.clone(), delivery: e.clone() };
            prop_assert_eq!(registry.release(&t, &e), Err(completed.clone()));
            let shown = completed.to_string();
            prop_assert!(shown.contains(e.as_str()) && shown.contains(&t.to_string()));
        }
    }
}

/// Boundary lengths, exactly.
#[test]
fn length_limits_are_exact() {
    let owner = "o".repeat(MAX_OWNER_LEN);
    let name = "n".repeat(MAX_REPO_NAME_LEN);
    assert!(Target::new(&format!("{owner}/{name}"), 1).is_ok());
    assert_eq!(
        Target::new(&format!("{owner}o/{name}"), 1),
        Err(TargetError::TooLong {
            part: "owner",
            len: MAX_OWNER_LEN + 1,
            max: MAX_OWNER_LEN
        })
    );
    assert_eq!(
        Target::new(&format!("{owner}/{name}n"), 1),
        Err(TargetError::TooLong {
            part: "repository name",
            len: MAX_REPO_NAME_LEN + 1,
            max: MAX_REPO_NAME_LEN
        })
    );
    let id = "x".repeat(MAX_DELIVERY_ID_LEN);
    assert!(DeliveryId::new(&id).is_ok());
    assert_eq!(
        DeliveryId::new(&format!("{id}x")),
        Err(DeliveryIdError::TooLong {
            len: MAX_DELIVERY_ID_LEN + 1,
            max: MAX_DELIVERY_ID_LEN
        })
    );
    // A megabyte of input: refused by length, and the error does not keep a copy of it.
    let huge = "a".repeat(1 << 20);
    let Err(WorkerIdError::NotANumber { input }) = WorkerId::from_str(&huge) else {
        panic!()
    };
    assert!(input.len() <= 64);
    let Err(TargetError::NotOwnerSlashName { input }) = Target::new(&huge, 1) else {
        panic!()
    };
    assert!(input.len() <= 160);
    // Multi-byte characters at the cut point are not split.
    let wide = "é".repeat(100);
    let Err(WorkerIdError::NotANumber { input }) = WorkerId::from_str(&wide) else {
        panic!()
    };
    assert!(input.len() <= 64 && wide.starts_with(&input));
}

/// The bound itself, pinned: `WorkerId::MAX` parses (the last id a registry hands out must be
/// addressable over the network), `MAX + 1` is `OutOfRange` carrying it, and so is every id past
/// it up to `u64::MAX`; one more digit overflows `u64` and is not a number.
#[test]
fn worker_id_max_parses_and_max_plus_one_is_out_of_range() {
    assert_eq!(WorkerId::MAX, 17_592_186_044_415);
    assert_eq!(
        WorkerId::from_str("17592186044415"),
        Ok(WorkerId::new(WorkerId::MAX))
    );
    assert_eq!(
        WorkerId::from_str("17592186044414"),
        Ok(WorkerId::new(WorkerId::MAX - 1))
    );
    assert_eq!(
        WorkerId::from_str("17592186044416"),
        Err(WorkerIdError::OutOfRange {
            id: WorkerId::MAX + 1
        })
    );
    assert_eq!(
        WorkerId::from_str(&u64::MAX.to_string()),
        Err(WorkerIdError::OutOfRange { id: u64::MAX })
    );
    assert_eq!(
        WorkerId::from_str("18446744073709551616"),
        Err(WorkerIdError::NotANumber {
            input: "18446744073709551616".into()
        })
    );
}

// ---- payloads ------------------------------------------------------------------------------------

/// Payload fields: mostly valid (so that one bad field at a time is what a refusal is about),
/// sometimes almost (a space, a length at the bound), sometimes anything at all.
fn event_text() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => re("[a-z_]{1,30}"),
        1 => re("[A-Za-z0-9._-]{63,66}"),
        1 => re("[a-z]{1,5}[ /:][a-z]{1,5}"),
        1 => nasty_text(),
    ]
}

fn content_type_text() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => re("[a-z]{1,10}/[a-z+.-]{1,20}(; charset=utf-8)?"),
        1 => re("[!-~ ]{254,257}"),
        1 => re("[a-z]{1,5}[\\t\\n\\x00\\x7f][a-z]{1,5}"),
        1 => nasty_text(),
    ]
}

fn header() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        12 => re("[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}"),
        2 => prop_oneof![Just("X-A".to_owned()), Just("x-a".to_owned())],
        1 => re("[A-Za-z-]{63,66}"),
        1 => re("[a-z]{1,5}[ :/(][a-z]{1,5}"),
        1 => nasty_text(),
    ];
    let value = prop_oneof![
        12 => re("[ -~\\t]{0,40}"),
        1 => re("[a-z]{510,514}"),
        1 => re("[a-z]{1,5}[\\r\\n\\x00\\x7f][a-z]{1,5}"),
        1 => nasty_text(),
    ];
    (name, value)
}

/// The first rule `build()` must report for these fields, as `Payload`'s documentation states
/// them (event, action, content type, then the headers in order), or `None` if all hold.
fn first_payload_problem(
    event: &str,
    action: Option<&str>,
    content_type: &str,
    headers: &[(String, String)],
) -> Option<&'static str> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_EVENT_NAME_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    };
    if !name_ok(event) {
        return Some("event");
    }
    if action.is_some_and(|a| !name_ok(a)) {
        return Some("action");
    }
    if content_type.is_empty()
        || content_type.len() > MAX_CONTENT_TYPE_LEN
        || !content_type
            .bytes()
            .all(|b| b == b' ' || b.is_ascii_graphic())
    {
        return Some("content type");
    }
    if headers.len() > MAX_PAYLOAD_HEADERS {
        return Some("headers");
    }
    let mut seen = BTreeSet::new();
    for (n, v) in headers {
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if n.is_empty()
            || n.len() > MAX_HEADER_NAME_LEN
            || !n.bytes().all(tchar)
            || v.len() > MAX_HEADER_VALUE_LEN
            || !v
                .bytes()
                .all(|b| b == b'\t' || b == b' ' || b.is_ascii_graphic())
            || !seen.insert(n.to_ascii_lowercase())
        {
            return Some("header");
        }
    }
    None
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// `Payload::builder(..).build()` accepts exactly what its documentation says, never panics,
    /// keeps the body byte for byte and counts its size as documented; a refusal names the first
    /// field that broke a rule, with what it saw.
    #[test]
    fn payload_builder_never_panics_and_explains_refusals(
        event in event_text(),
        action in proptest::option::of(event_text()),
        content_type in content_type_text(),
        headers in proptest::collection::vec(header(), 0..20),
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut b = Payload::builder(event.clone(), body.clone()).content_type(content_type.clone());
        if let Some(a) = &action {
            b = b.action(a.clone());
        }
        for (n, v) in &headers {
            b = b.header(n.clone(), v.clone());
        }
        let expected = first_payload_problem(&event, action.as_deref(), &content_type, &headers);
        match b.build() {
            Ok(p) => {
                prop_assert_eq!(expected, None);
                prop_assert_eq!(&p.body()[..], &body[..]);
                prop_assert_eq!((p.event(), p.action(), p.content_type()),
                    (event.as_str(), action.as_deref(), content_type.as_str()));
                let meta: usize = event.len() + action.as_ref().map_or(0, String::len)
                    + content_type.len() + headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
                prop_assert_eq!(p.size(), (body.len() + meta) as u64);
                prop_assert!(meta <= MAX_PAYLOAD_META_LEN);
                for (n, v) in &headers {
                    prop_assert_eq!(p.header(n), Some(v.as_str()));
                }
            }
            Err(e) => {
                let field = match &e {
                    PayloadError::Empty { field }
                    | PayloadError::TooLong { field, .. }
                    | PayloadError::BadByte { field, .. } => *field,
                    PayloadError::TooManyHeaders { count, max } => {
                        prop_assert_eq!((*count, *max), (headers.len(), MAX_PAYLOAD_HEADERS));
                        "headers"
                    }
                    PayloadError::BadHeader { .. } | PayloadError::DuplicateHeader { .. } => "header",
                    other => panic!("unknown refusal {other:?}"),
                };
                prop_assert_eq!(Some(field), expected, "{}", e);
                if let PayloadError::BadByte { field, found } = &e {
                    let text = match *field {
                        "event" => event.as_str(),
                        "action" => action.as_deref().unwrap_or_default(),
                        _ => content_type.as_str(),
                    };
                    prop_assert!(text.as_bytes().contains(found), "{e}");
                }
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    /// An admission whose payload is larger than `max_payload_bytes` is refused with its size
    /// and the limit, whatever the pair's state, and leaves no claim; one within it is admitted
    /// and found again byte for byte.
    #[test]
    fn oversized_payloads_are_refused_with_their_size_and_leave_no_claim(
        body in 0usize..4000,
        limit in 1u64..4000,
    ) {
        let registry = Direct::with_clock(
            RegistryConfig::builder().max_payload_bytes(limit).build().unwrap(),
            ManualClock::new(),
        );
        let p = Payload::builder("push", vec![0xA5u8; body]).build().unwrap();
        let (t, d) = (Target::new("octo/repo", 1).unwrap(), DeliveryId::new("d").unwrap());
        match registry.admit_with(&t, &d, Some(&p)) {
            Err(RegistryError::PayloadTooLarge { size, limit: l }) => {
                prop_assert_eq!((size, l), (p.size(), limit));
                prop_assert!(p.size() > limit);
                prop_assert_eq!(registry.claim_count(), 0);
                prop_assert_eq!(registry.stats().payloads_too_large, 1);
            }
            Ok(Admission::Assigned(_)) => {
                prop_assert!(p.size() <= limit);
                prop_assert_eq!(registry.payload(&t, &d), Some(p.clone()));
                prop_assert_eq!(registry.stats().payload_bytes_held, p.size());
            }
            other => panic!("{other:?}"),
        }
    }
}
