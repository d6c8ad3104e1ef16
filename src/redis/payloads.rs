//! Payloads on Redis (see `docs::redis`, "Payloads"): their encoding as the scripts store it
//! (`{n}:p:<member>`, `{n}:r:<entry id>`, field `b`), the lookup, and the read that gives the
//! released events a sweep hands out their payloads.
//!
//! The encoding: a version byte, then the event name, the action (empty for none) and the
//! content type, each a 4-byte big-endian length and its bytes, the number of extra headers
//! (4 bytes) and each name and value the same way, then the body as it is (binary, to the end).

use bytes::Bytes;
use redis::Value;

use super::codec::bad;
use super::scripts::{self, Call, SCRIPTS};
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target};
use crate::api::payload::Payload;
use crate::api::report::ReleasedEvent;
use crate::api::snapshot::PayloadUsage;

/// The outcome word of an admission refused for the payload budget (with held, needed, limit).
pub(crate) const PAYLOAD_BUDGET: &str = "payload_budget";

/// The encoding's version byte.
const VERSION: u8 = 1;

/// `p` as stored.
pub(crate) fn encode(p: &Payload) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.body().len() + 64);
    out.push(VERSION);
    let put = |out: &mut Vec<u8>, s: &str| {
        // Each piece of metadata is bounded far below 4 GiB by `Payload`'s validation.
        out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    put(&mut out, p.event());
    put(&mut out, p.action().unwrap_or(""));
    put(&mut out, p.content_type());
    let headers = p.headers();
    out.extend_from_slice(
        &u32::try_from(headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for (name, value) in headers {
        put(&mut out, name);
        put(&mut out, value);
    }
    out.extend_from_slice(p.body());
    out
}

/// A stored payload; anything that does not decode is a backend error (a bug or a foreign writer).
pub(crate) fn decode(stored: Vec<u8>) -> Result<Payload, RegistryError> {
    let stored = Bytes::from(stored);
    if stored.first() != Some(&VERSION) {
        return Err(bad(format!("payload encoding {:?}", stored.first())));
    }
    let mut at = 1;
    let event = text(&stored, &mut at)?;
    let action = text(&stored, &mut at)?;
    let content_type = text(&stored, &mut at)?;
    let n = len(&stored, &mut at)?;
    let mut headers = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        headers.push((text(&stored, &mut at)?, text(&stored, &mut at)?));
    }
    let mut builder = Payload::builder(event, stored.slice(at..)).content_type(content_type);
    if !action.is_empty() {
        builder = builder.action(action);
    }
    for (name, value) in headers {
        builder = builder.header(name, value);
    }
    builder
        .build()
        .map_err(|e| bad(format!("a stored payload that does not validate: {e}")))
}

/// The length at `at` (4 bytes, big-endian), checked against what follows it.
fn len(stored: &[u8], at: &mut usize) -> Result<usize, RegistryError> {
    let raw = stored
        .get(*at..*at + 4)
        .ok_or_else(|| bad("a truncated payload"))?;
    *at += 4;
    let n = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize;
    (*at + n <= stored.len())
        .then_some(n)
        .ok_or_else(|| bad("a truncated payload"))
}

/// The text at `at` (its length, then its bytes).
fn text(stored: &[u8], at: &mut usize) -> Result<String, RegistryError> {
    let n = len(stored, at)?;
    let s = std::str::from_utf8(&stored[*at..*at + n])
        .map_err(|e| bad(format!("payload metadata: {e}")))?
        .to_owned();
    *at += n;
    Ok(s)
}

/// A lookup's reply: the stored payload, or none.
fn decode_reply(v: Value) -> Result<Option<Payload>, RegistryError> {
    match v {
        Value::Nil | Value::Boolean(false) | Value::Int(0) => Ok(None),
        Value::BulkString(b) => decode(b).map(Some),
        other => Err(bad(format!("payload: {other:?}"))),
    }
}

impl RedisRegistry {
    /// The lookup of the pair's payload (`entry`: the released entry being handed out, or "").
    fn lookup_call(&self, target: &Target, delivery: &DeliveryId, entry: &str) -> Call {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.payload);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(entry)
            .arg(l.timeout_ms)
            .arg(l.retention_ms);
        inv
    }

    /// The payload stored for the pair (`payload.lua`: one read-only call).
    pub(crate) async fn lookup(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<Option<Payload>, RegistryError> {
        let v = self.invoke(&self.lookup_call(target, delivery, "")).await?;
        decode_reply(v)
    }

    /// Gives each released event handed out its payload, as stored when this reads it: the
    /// entry's own copy (a death's, a stuck release's), else the pair's (a promoted delivery's
    /// claim). One pipelined round trip, one read-only call per event (each reply at most
    /// `max_payload_bytes`), after the step that handed the events out.
    pub(crate) async fn attach_payloads(
        &self,
        events: &mut [ReleasedEvent],
    ) -> Result<(), RegistryError> {
        if events.is_empty() {
            return Ok(());
        }
        let calls: Vec<Call> = events
            .iter()
            .map(|e| {
                let entry = e.receipt().map_or("", |r| r.as_str());
                self.lookup_call(&e.target, &e.delivery, entry)
            })
            .collect();
        let mut conn = self.inner.conn.clone();
        let replies: Vec<Value> = scripts::invoke_all(&calls, &mut conn)
            .await
            .map_err(super::error::backend)?;
        if replies.len() != events.len() {
            return Err(bad(format!(
                "{} payload lookups answered {}",
                events.len(),
                replies.len()
            )));
        }
        for (e, v) in events.iter_mut().zip(replies) {
            e.payload = decode_reply(v)?;
        }
        Ok(())
    }

    /// The end of a sweep: the payloads held now (`HMGET {n}:pay n b`) for the gauges and the
    /// cached snapshot, observed at registry time `at_ms`.
    pub(crate) async fn payloads_now(&self, at_ms: u64) -> Result<(), RegistryError> {
        let mut conn = self.inner.conn.clone();
        let (n, b): (Option<u64>, Option<u64>) = ::redis::cmd("HMGET")
            .arg(format!("{}pay", self.inner.keys.prefix))
            .arg("n")
            .arg("b")
            .query_async(&mut conn)
            .await
            .map_err(super::error::backend)?;
        let (n, b) = (n.unwrap_or(0), b.unwrap_or(0));
        self.inner.counters.observe_payloads(at_ms, n, b);
        self.inner.snapshot.set_payloads(PayloadUsage::new(
            usize::try_from(n).unwrap_or(usize::MAX),
            b,
            self.inner.config.payload_budget(),
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_round_trips_byte_for_byte() {
        let body: Vec<u8> = (0..=255u8).chain([0, 0xff, 0xc3, 0x28]).collect();
        let p = Payload::builder("pull_request", body.clone())
            .action("opened")
            .content_type("application/json")
            .header("x-github-hook-id", "42")
            .header("x-hub-signature-256", "sha256=00")
            .build()
            .unwrap();
        let back = decode(encode(&p)).unwrap();
        assert_eq!(back, p);
        assert_eq!(&back.body()[..], &body[..]);
        let bare = Payload::builder("ping", Bytes::new()).build().unwrap();
        assert_eq!(decode(encode(&bare)).unwrap(), bare);
    }

    #[test]
    fn a_truncated_or_foreign_encoding_is_an_error_not_a_guess() {
        let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
        let full = encode(&p);
        for cut in [0, 1, 3, 6] {
            assert!(decode(full[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut foreign = full.clone();
        foreign[0] = 9;
        assert!(decode(foreign).is_err());
    }
}
