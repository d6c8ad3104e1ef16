//! Encoding between the contract's types and what the scripts store and return: claim members,
//! worker lines, the published snapshot, lifecycle events and released-stream entries, plus a
//! small reader for script replies. Anything the server sends that does not decode is a
//! non-retryable backend error (it means a bug or a foreign writer), never a guess.

use std::fmt;
use std::time::{Duration, SystemTime};

use redis::Value;

use crate::api::error::RegistryError;
use crate::api::events::Event;
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::report::{Receipt, ReleaseReason, ReleasedEvent};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot, WorkerInfo};
use crate::api::status::{Activity, DeadReason, Status, WorkerKind};
use crate::remote::vocab::ReplyError;

/// What a reply that did not decode looked like.
#[derive(Debug)]
pub(crate) struct CodecError(pub(crate) String);

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected reply from Redis: {}", self.0)
    }
}

impl std::error::Error for CodecError {}

/// A non-retryable backend error for a reply that did not decode.
pub(crate) fn bad(what: impl Into<String>) -> RegistryError {
    RegistryError::backend("redis", false, CodecError(what.into()))
}

/// The claim member of a pair: `<target>:<delivery>` (targets contain no `:`).
pub(crate) fn member(target: &Target, delivery: &DeliveryId) -> String {
    format!("{target}:{delivery}")
}

/// The wall-clock time of a registry time in ms (the server's clock is a Unix clock).
pub(crate) fn wall(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// A dead reason from its script code.
pub(crate) fn dead_reason(code: i64) -> Result<DeadReason, RegistryError> {
    Ok(match code {
        1 => DeadReason::MissedHeartbeats,
        2 => DeadReason::Exited,
        3 => DeadReason::Deregistered,
        4 => DeadReason::DrainTimedOut,
        other => return Err(bad(format!("dead reason code {other}"))),
    })
}

/// A release reason from its script code.
pub(crate) fn release_reason(code: i64) -> Result<ReleaseReason, RegistryError> {
    Ok(match code {
        1..=4 => ReleaseReason::WorkerDied(dead_reason(code)?),
        5 => ReleaseReason::Stuck,
        6 => ReleaseReason::Unbound,
        other => return Err(bad(format!("release reason code {other}"))),
    })
}

fn parse_int(s: &str, what: &str) -> Result<i64, RegistryError> {
    s.parse()
        .map_err(|_| bad(format!("{what}: {s:?} is not an integer")))
}

fn parse_u64(s: &str, what: &str) -> Result<u64, RegistryError> {
    s.parse()
        .map_err(|_| bad(format!("{what}: {s:?} is not a non-negative integer")))
}

/// A worker id as the scripts write it.
pub(crate) fn worker_id(s: &str) -> Result<WorkerId, RegistryError> {
    s.parse().map_err(|e| bad(format!("worker id {s:?}: {e}")))
}

/// An optional worker id (`""` for none).
pub(crate) fn opt_worker_id(s: &str) -> Result<Option<WorkerId>, RegistryError> {
    if s.is_empty() {
        Ok(None)
    } else {
        worker_id(s).map(Some)
    }
}

fn target(s: &str) -> Result<Target, RegistryError> {
    s.parse().map_err(|e| bad(format!("target {s:?}: {e}")))
}

fn opt_target(s: &str) -> Result<Option<Target>, RegistryError> {
    if s.is_empty() {
        Ok(None)
    } else {
        target(s).map(Some)
    }
}

fn delivery(s: &str) -> Result<DeliveryId, RegistryError> {
    DeliveryId::new(s).map_err(|e| bad(format!("delivery {s:?}: {e}")))
}

/// A reader over one script reply (an array), field by field.
pub(crate) struct Reply<'a> {
    items: &'a [Value],
    pos: usize,
}

impl<'a> Reply<'a> {
    /// The reply `v`, which must be an array.
    pub(crate) fn of(v: &'a Value) -> Result<Self, RegistryError> {
        match v {
            Value::Array(items) | Value::Set(items) => Ok(Self { items, pos: 0 }),
            other => Err(bad(format!("expected an array, got {other:?}"))),
        }
    }

    /// A reader of the one value `v`.
    fn of_one(v: &'a Value) -> Self {
        Self {
            items: std::slice::from_ref(v),
            pos: 0,
        }
    }

    /// Fields not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.items.len() - self.pos
    }

    fn next(&mut self) -> Result<&'a Value, RegistryError> {
        let v = self
            .items
            .get(self.pos)
            .ok_or_else(|| bad(format!("reply ended after {} fields", self.pos)))?;
        self.pos += 1;
        Ok(v)
    }

    /// The next field as text (integers are formatted).
    pub(crate) fn text(&mut self) -> Result<std::borrow::Cow<'a, str>, RegistryError> {
        match self.next()? {
            Value::BulkString(b) => std::str::from_utf8(b)
                .map(std::borrow::Cow::Borrowed)
                .map_err(|_| bad("a reply field is not UTF-8")),
            Value::SimpleString(s) => Ok(std::borrow::Cow::Borrowed(s.as_str())),
            Value::Int(i) => Ok(std::borrow::Cow::Owned(i.to_string())),
            Value::Nil => Ok(std::borrow::Cow::Borrowed("")),
            other => Err(bad(format!("expected text, got {other:?}"))),
        }
    }

    /// The next field as an integer (a Lua number, or decimal text).
    pub(crate) fn int(&mut self) -> Result<i64, RegistryError> {
        match self.next()? {
            Value::Int(i) => Ok(*i),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("a reply field is not an integer")),
            other => Err(bad(format!("expected an integer, got {other:?}"))),
        }
    }

    /// The next field as a non-negative integer.
    pub(crate) fn uint(&mut self) -> Result<u64, RegistryError> {
        let i = self.int()?;
        u64::try_from(i).map_err(|_| bad(format!("expected a non-negative integer, got {i}")))
    }

    /// The next field as a nested array.
    pub(crate) fn array(&mut self) -> Result<Reply<'a>, RegistryError> {
        Reply::of(self.next()?)
    }
}

/// A reply read by name: a flat list of name, value pairs, in one of two forms (see
/// `docs::redis`, "Replies"). A reply with nested values is an array (the functions' `{'name',
/// value, ...}`); one without is *packed*, its names and values joined by tabs in one bulk string
/// (`outcome\tassigned\tworker\t7...`), which the server converts and the client parses at a
/// fraction of an array's cost. Both forms are read by name, the same way. A missing name is a
/// non-retryable [`ReplyError`] naming it, never a default; so is a value of the wrong type.
pub(crate) struct Fields<'a> {
    form: Form<'a>,
}

/// The two forms of a [`Fields`] reply.
enum Form<'a> {
    /// An array of name, value pairs.
    Pairs(&'a [Value]),
    /// One tab-separated string of names and values (an even number of them).
    Packed(&'a str),
}

/// One value of a [`Fields`] reply.
#[derive(Clone, Copy)]
enum Field<'a> {
    Value(&'a Value),
    Text(&'a str),
}

impl fmt::Debug for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Value(v) => v.fmt(f),
            Self::Text(t) => t.fmt(f),
        }
    }
}

/// A non-retryable backend error for a reply that does not fit its schema.
pub(crate) fn schema(e: ReplyError) -> RegistryError {
    RegistryError::backend("redis", false, e)
}

impl<'a> Fields<'a> {
    /// The reply `v`: an array of an even length, or a packed string of an even number of
    /// tab-separated parts.
    pub(crate) fn of(v: &'a Value) -> Result<Self, RegistryError> {
        match v {
            Value::Array(items) if items.len() % 2 == 0 => Ok(Self {
                form: Form::Pairs(items),
            }),
            Value::BulkString(b) => {
                let text = std::str::from_utf8(b)
                    .map_err(|_| bad(format!("a packed reply is not UTF-8: {v:?}")))?;
                // n tabs separate n + 1 parts: pairs need an odd number of them.
                let tabs = text.bytes().filter(|&c| c == b'\t').count();
                if tabs % 2 == 0 {
                    return Err(bad(format!(
                        "expected name, value pairs, got the packed reply {text:?}"
                    )));
                }
                Ok(Self {
                    form: Form::Packed(text),
                })
            }
            other => Err(bad(format!("expected name, value pairs, got {other:?}"))),
        }
    }

    /// The field `name`, if the reply has it.
    fn opt(&self, name: &str) -> Option<Field<'a>> {
        match self.form {
            Form::Pairs(items) => items
                .chunks_exact(2)
                .find(|p| matches!(&p[0], Value::BulkString(b) if b.as_slice() == name.as_bytes()))
                .map(|p| Field::Value(&p[1])),
            Form::Packed(text) => {
                let mut parts = text.split('\t');
                while let (Some(n), Some(v)) = (parts.next(), parts.next()) {
                    if n == name {
                        return Some(Field::Text(v));
                    }
                }
                None
            }
        }
    }

    /// Whether the reply has the field `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.opt(name).is_some()
    }

    fn get(&self, name: &'static str) -> Result<Field<'a>, RegistryError> {
        self.opt(name)
            .ok_or_else(|| schema(ReplyError::Missing { field: name }))
    }

    /// The field `name` as text (integers are formatted).
    pub(crate) fn text(
        &self,
        name: &'static str,
    ) -> Result<std::borrow::Cow<'a, str>, RegistryError> {
        match self.get(name)? {
            Field::Text(t) => Ok(std::borrow::Cow::Borrowed(t)),
            Field::Value(v) => Reply::of_one(v)
                .text()
                .map_err(|_| schema(ReplyError::invalid(name, v))),
        }
    }

    /// The field `name` as an integer.
    pub(crate) fn int(&self, name: &'static str) -> Result<i64, RegistryError> {
        let field = self.get(name)?;
        let parsed = match field {
            Field::Text(t) => t.parse().ok(),
            Field::Value(v) => Reply::of_one(v).int().ok(),
        };
        parsed.ok_or_else(|| schema(ReplyError::invalid(name, field)))
    }

    /// The field `name` as a non-negative integer.
    pub(crate) fn uint(&self, name: &'static str) -> Result<u64, RegistryError> {
        let i = self.int(name)?;
        u64::try_from(i).map_err(|_| schema(ReplyError::invalid(name, i)))
    }

    /// The field `name` as a flag (`0` or `1`).
    pub(crate) fn flag(&self, name: &'static str) -> Result<bool, RegistryError> {
        match self.int(name)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(schema(ReplyError::invalid(name, other))),
        }
    }

    /// The field `name` as a worker id.
    pub(crate) fn worker(&self, name: &'static str) -> Result<WorkerId, RegistryError> {
        let t = self.text(name)?;
        t.parse()
            .map_err(|_| schema(ReplyError::invalid(name, &*t)))
    }

    /// The field `name` as an optional worker id (`""` for none).
    pub(crate) fn opt_worker(&self, name: &'static str) -> Result<Option<WorkerId>, RegistryError> {
        let t = self.text(name)?;
        if t.is_empty() {
            return Ok(None);
        }
        t.parse()
            .map(Some)
            .map_err(|_| schema(ReplyError::invalid(name, &*t)))
    }

    /// The field `name` as a nested array (a Lua empty table arrives as an empty array; a
    /// packed reply has none).
    pub(crate) fn array(&self, name: &'static str) -> Result<Reply<'a>, RegistryError> {
        let field = self.get(name)?;
        match field {
            Field::Value(v) => Reply::of(v).map_err(|_| schema(ReplyError::invalid(name, field))),
            Field::Text(_) => Err(schema(ReplyError::invalid(name, field))),
        }
    }
}

/// A decision's `outcome` word, and the fields beside it.
pub(crate) fn outcome(v: &Value) -> Result<(std::borrow::Cow<'_, str>, Fields<'_>), RegistryError> {
    let f = Fields::of(v)?;
    Ok((f.text("outcome")?, f))
}

/// The error for an outcome word a decision does not answer.
pub(crate) fn bad_outcome(decision: &str, word: &str) -> RegistryError {
    schema(ReplyError::Invalid {
        field: "outcome",
        observed: format!("{word:?} (from {decision})"),
    })
}

/// Decodes one worker line (`id t s b x bt r hb c n dd da`, see `scripts/lib_workers.lua`) as of `now`.
pub(crate) fn decode_worker(line: &str, now: u64) -> Result<WorkerInfo, RegistryError> {
    let f: Vec<&str> = line.split('\t').collect();
    let [id, t, s, b, x, bt, r, hb, c, n, dd, da] = f[..] else {
        return Err(bad(format!("worker line with {} fields", f.len())));
    };
    let id = worker_id(id)?;
    let target = opt_target(t)?;
    let kind = if target.is_some() {
        WorkerKind::Spawned
    } else {
        WorkerKind::Registered
    };
    let created = parse_u64(c, "created")?;
    let mut info = WorkerInfo::new(id, target, kind, wall(created));
    info.status = match s {
        "0" => Status::Active,
        "1" => Status::Draining,
        "2" => Status::Dead(dead_reason(parse_int(r, "reason")?)?),
        other => return Err(bad(format!("worker status {other:?}"))),
    };
    info.activity = if b == "1" {
        Activity::Busy
    } else {
        Activity::Idle
    };
    info.suspect = x == "1";
    info.has_heartbeated = bt == "1";
    let hb = parse_u64(hb, "last heartbeat")?;
    info.last_heartbeat = wall(hb);
    info.heartbeat_age = Duration::from_millis(now.saturating_sub(hb));
    info.uptime = Duration::from_millis(now.saturating_sub(created));
    let seq = if n.is_empty() {
        0
    } else {
        parse_u64(n, "assignments")?
    };
    info.token = FencingToken::new(id, seq).map_err(|e| bad(format!("worker id: {e}")))?;
    if matches!(info.status, Status::Dead(_)) && !da.is_empty() {
        info.died_at = Some(wall(parse_u64(da, "died at")?));
    }
    if info.status == Status::Draining && !dd.is_empty() {
        info.drain_deadline = Some(wall(parse_u64(dd, "drain deadline")?));
    }
    Ok(info)
}

/// Decodes a published snapshot: a header line `version now brake in_flight retained`, then one
/// worker line each.
pub(crate) fn decode_snapshot(text: &str, limit: usize) -> Result<StatusSnapshot, RegistryError> {
    let mut lines = text.split('\n');
    let header: Vec<&str> = lines.next().unwrap_or("").split('\t').collect();
    let [version, now, brake, in_flight, retained] = header[..] else {
        return Err(bad(format!("snapshot header with {} fields", header.len())));
    };
    let now = parse_u64(now, "snapshot time")?;
    let workers = lines
        .filter(|l| !l.is_empty())
        .map(|l| decode_worker(l, now))
        .collect::<Result<Vec<_>, _>>()?;
    let claims = ClaimCounts {
        in_flight: parse_u64(in_flight, "in flight")? as usize,
        retained: parse_u64(retained, "retained")? as usize,
    };
    Ok(StatusSnapshot::new(
        parse_u64(version, "snapshot version")?,
        wall(now),
        Duration::from_millis(now),
        workers,
        limit,
        brake == "1",
        claims,
    ))
}

/// Decodes one lifecycle event as published by the scripts: its sequence number and the event.
pub(crate) fn decode_event(text: &str) -> Result<(u64, Event), RegistryError> {
    let f: Vec<&str> = text.split('\t').collect();
    let seq = parse_u64(f.first().copied().unwrap_or(""), "event sequence")?;
    let field = |i: usize| f.get(i).copied().unwrap_or("");
    let event = match field(1) {
        "C" => Event::WorkerCreated {
            worker: worker_id(field(2))?,
            target: opt_target(field(3))?,
        },
        "D" => Event::WorkerDraining {
            worker: worker_id(field(2))?,
            target: opt_target(field(3))?,
        },
        "S" => Event::WorkerSuspect {
            worker: worker_id(field(2))?,
            target: opt_target(field(3))?,
        },
        "X" => Event::WorkerDied {
            worker: worker_id(field(2))?,
            target: opt_target(field(3))?,
            reason: dead_reason(parse_int(field(4), "reason")?)?,
        },
        "K" => Event::DeliveryStuck {
            worker: worker_id(field(2))?,
            target: target(field(3))?,
            delivery: delivery(field(4))?,
        },
        "R" => Event::TargetReleased {
            target: target(field(2))?,
            deliveries: f
                .get(3..)
                .unwrap_or(&[])
                .iter()
                .map(|d| delivery(d))
                .collect::<Result<_, _>>()?,
        },
        "P" => Event::DeliveryPromoted {
            worker: worker_id(field(2))?,
            target: target(field(3))?,
            delivery: delivery(field(4))?,
        },
        "E" => Event::WaitingExpired {
            target: target(field(2))?,
            delivery: delivery(field(3))?,
            reason: crate::ExpireReason::WaitedTooLong {
                limit: Duration::from_millis(parse_u64(field(4), "max_wait")?),
            },
        },
        other => return Err(bad(format!("event kind {other:?}"))),
    };
    Ok((seq, event))
}

/// Decodes the released entries a sweep handed out: groups of (entry id, target, delivery,
/// holder, reason). A promoted delivery's reason is `7:<assignments>:<new>` (its assignment, on
/// the holder: see `scripts/lib_waiting.lua`); any other is a release reason code.
pub(crate) fn decode_released(mut r: Reply<'_>) -> Result<Vec<ReleasedEvent>, RegistryError> {
    let mut out = Vec::with_capacity(r.remaining() / 5);
    while r.remaining() > 0 {
        let id = r.text()?.into_owned();
        let t = target(&r.text()?)?;
        let d = delivery(&r.text()?)?;
        let holder = opt_worker_id(&r.text()?)?;
        let reason = r.text()?;
        let event = match reason.strip_prefix("7:") {
            Some(rest) => {
                let worker = holder.ok_or_else(|| bad("a promoted entry without its worker"))?;
                ReleasedEvent::promoted(t, d, promoted_assignment(worker, rest)?)
            }
            None => {
                ReleasedEvent::new(t, d, holder, release_reason(parse_int(&reason, "reason")?)?)
            }
        };
        out.push(event.with_receipt(Receipt::new(id)));
    }
    Ok(out)
}

/// A promoted entry's assignment on `worker` from `<assignments>:<new>`.
fn promoted_assignment(worker: WorkerId, text: &str) -> Result<crate::Assignment, RegistryError> {
    let (n, new) = text
        .split_once(':')
        .ok_or_else(|| bad(format!("promoted reason {text:?}")))?;
    let token = FencingToken::new(worker, parse_u64(n, "promoted assignments")?)
        .map_err(|_| bad(format!("promoted assignments {n:?}")))?;
    Ok(crate::Assignment::new(worker, token, new == "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_lines_decode_every_field() {
        let w = decode_worker("7\to/r#3\t1\t1\t0\t1\t\t1500\t1000\t4\t9000\t", 2000).unwrap();
        assert_eq!(w.id, WorkerId::new(7));
        assert_eq!(w.target, Some(Target::new("o/r", 3).unwrap()));
        assert_eq!(
            (w.status, w.activity, w.suspect),
            (Status::Draining, Activity::Busy, false)
        );
        assert!(w.has_heartbeated);
        assert_eq!(w.heartbeat_age, Duration::from_millis(500));
        assert_eq!(w.uptime, Duration::from_millis(1000));
        assert_eq!(w.token, FencingToken::new(WorkerId::new(7), 4).unwrap());
        assert_eq!(w.drain_deadline, Some(wall(9000)));
        assert_eq!(w.died_at, None);

        let d = decode_worker("8\t\t2\t0\t0\t0\t4\t10\t10\t0\t\t20", 30).unwrap();
        assert_eq!(d.status, Status::Dead(DeadReason::DrainTimedOut));
        assert_eq!(
            (d.kind, d.died_at),
            (WorkerKind::Registered, Some(wall(20)))
        );
        assert!(decode_worker("8\t\t9\t0\t0\t0\t\t10\t10\t0\t\t", 30).is_err());
        assert!(decode_worker("8\t\t0", 30).is_err());
    }

    #[test]
    fn snapshots_and_events_decode_and_bad_input_is_a_non_retryable_error() {
        let s =
            decode_snapshot("3\t5000\t1\t2\t1\n1\t\t0\t0\t0\t0\t\t5000\t4000\t0\t\t", 8).unwrap();
        assert_eq!(
            (
                s.version,
                s.brake_engaged,
                s.capacity.used,
                s.capacity.limit
            ),
            (3, true, 1, 8)
        );
        assert_eq!((s.claims.in_flight, s.claims.retained), (2, 1));
        assert_eq!(s.taken_at_monotonic, Duration::from_millis(5000));

        let (seq, e) = decode_event("12\tR\to/r#1\td-1\td-2").unwrap();
        assert_eq!(seq, 12);
        assert_eq!(
            e,
            Event::TargetReleased {
                target: Target::new("o/r", 1).unwrap(),
                deliveries: vec![
                    DeliveryId::new("d-1").unwrap(),
                    DeliveryId::new("d-2").unwrap()
                ],
            }
        );
        let (_, e) = decode_event("1\tX\t4\t\t3").unwrap();
        assert_eq!(e.kind(), "worker_died");
        let err = decode_event("1\tQ\t4").unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("event kind"), "{err}");
    }

    #[test]
    fn release_reasons_round_trip_their_codes() {
        assert_eq!(
            release_reason(1).unwrap(),
            ReleaseReason::WorkerDied(DeadReason::MissedHeartbeats)
        );
        assert_eq!(release_reason(5).unwrap(), ReleaseReason::Stuck);
        assert_eq!(release_reason(6).unwrap(), ReleaseReason::Unbound);
        assert!(release_reason(7).is_err());
    }

    #[test]
    fn a_packed_reply_reads_by_name_as_its_array_form_does() {
        let packed =
            Value::BulkString(b"outcome\tassigned\tworker\t7\tholder\t\tlive\t-1".to_vec());
        let pairs = Value::Array(
            [
                "outcome", "assigned", "worker", "7", "holder", "", "live", "-1",
            ]
            .iter()
            .map(|s| Value::BulkString(s.as_bytes().to_vec()))
            .collect(),
        );
        for v in [&packed, &pairs] {
            let f = Fields::of(v).unwrap();
            assert_eq!(f.text("outcome").unwrap(), "assigned");
            assert_eq!(f.worker("worker").unwrap(), WorkerId::new(7));
            assert_eq!(f.opt_worker("holder").unwrap(), None);
            assert_eq!(f.int("live").unwrap(), -1);
            assert!(f.uint("live").is_err());
            assert!(f.has("worker") && !f.has("seq"));
            let missing = f.uint("seq").unwrap_err().to_string();
            assert!(missing.contains("\"seq\""), "{missing}");
            let bad = f.int("outcome").unwrap_err().to_string();
            assert!(bad.contains("assigned"), "{bad}");
        }
        // A packed reply has no nested values, and its parts come in pairs.
        let f = Fields::of(&packed).unwrap();
        assert!(f.array("worker").is_err());
        let odd = Value::BulkString(b"outcome\tassigned\tworker".to_vec());
        let err = Fields::of(&odd).err().unwrap().to_string();
        assert!(err.contains("outcome\\tassigned\\tworker"), "{err}");
        assert!(Fields::of(&Value::BulkString(vec![0xff, b'\t', b'a'])).is_err());
    }
}
