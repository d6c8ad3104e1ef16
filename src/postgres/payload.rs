//! Payloads on PostgreSQL (`wr_payloads`, `wr_payload_*` in `functions/payloads.sql`; the design in
//! `docs::postgres`, "Payloads"): a [`Payload`] as the functions take it (parameters: the body as
//! `bytea`, the extra headers as one `text[]` of names and values), and back, from the lookup's
//! row or from the outbox's `jsonb` (the body in base64).

use base64::Engine as _;
use serde::Deserialize;
use tokio_postgres::Row;

use tokio_postgres::types::FromSql;

use super::error::{decode, Failure};
use crate::api::payload::Payload;

/// The lookup (`WorkerRegistry::payload`): one primary-key read, its row read by [`from_row`].
pub(crate) const LOOKUP: &str = "SELECT o_event, o_action, o_ctype, o_headers, o_body \
                                 FROM wr_payload($1, $2, $3, $4)";

/// One column of the lookup's row.
fn col<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, Failure> {
    row.try_get(name)
        .map_err(|e| decode(format!("column {name}: {e}")))
}

/// A payload as `wr_admit`'s parameters (all `NULL` for none).
pub(crate) struct Params<'a> {
    pub(crate) event: Option<&'a str>,
    pub(crate) action: Option<&'a str>,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) headers: Vec<&'a str>,
    pub(crate) body: Option<&'a [u8]>,
    pub(crate) size: Option<i64>,
}

impl<'a> Params<'a> {
    pub(crate) fn of(payload: Option<&'a Payload>) -> Self {
        let Some(p) = payload else {
            return Self {
                event: None,
                action: None,
                content_type: None,
                headers: Vec::new(),
                body: None,
                size: None,
            };
        };
        Self {
            event: Some(p.event()),
            action: p.action(),
            content_type: Some(p.content_type()),
            headers: p.headers().flat_map(|(n, v)| [n, v]).collect(),
            body: Some(&p.body()[..]),
            // At most max_payload_bytes, checked before: far inside i64.
            size: Some(i64::try_from(p.size()).unwrap_or(i64::MAX)),
        }
    }
}

/// A payload from its stored parts.
fn build(
    event: String,
    action: Option<String>,
    content_type: String,
    headers: Vec<String>,
    body: Vec<u8>,
) -> Result<Payload, Failure> {
    if !headers.len().is_multiple_of(2) {
        return Err(decode("payload headers: a name without its value"));
    }
    let mut b = Payload::builder(event, body).content_type(content_type);
    if let Some(a) = action {
        b = b.action(a);
    }
    for pair in headers.chunks(2) {
        b = b.header(pair[0].clone(), pair[1].clone());
    }
    b.build()
        .map_err(|e| decode(format!("stored payload: {e}")))
}

/// A payload as the outbox hands it out (`wr_payload_json`).
#[derive(Debug, Deserialize)]
pub(crate) struct PayloadJson {
    event: String,
    action: Option<String>,
    content_type: String,
    #[serde(default)]
    headers: Vec<String>,
    /// Base64, standard alphabet, no line breaks.
    body: String,
}

impl PayloadJson {
    pub(crate) fn payload(&self) -> Result<Payload, Failure> {
        let body = base64::engine::general_purpose::STANDARD
            .decode(&self.body)
            .map_err(|e| decode(format!("payload body: {e}")))?;
        build(
            self.event.clone(),
            self.action.clone(),
            self.content_type.clone(),
            self.headers.clone(),
            body,
        )
    }
}

/// The lookup's row: the payload, or none (every column `NULL`).
pub(crate) fn from_row(row: &Row) -> Result<Option<Payload>, Failure> {
    let Some(body) = col::<Option<Vec<u8>>>(row, "o_body")? else {
        return Ok(None);
    };
    let event: Option<String> = col(row, "o_event")?;
    let ctype: Option<String> = col(row, "o_ctype")?;
    let headers: Option<Vec<String>> = col(row, "o_headers")?;
    build(
        event.ok_or_else(|| decode("payload without its event"))?,
        col(row, "o_action")?,
        ctype.ok_or_else(|| decode("payload without its content type"))?,
        headers.unwrap_or_default(),
        body,
    )
    .map(Some)
}
