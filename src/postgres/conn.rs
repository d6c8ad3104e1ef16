//! One call's connection: checked out of the pool, used for one statement, and given back only if
//! it is fit for the next call.
//!
//! - **A call that ends early** (its timeout fired, or its caller dropped it) may leave its
//!   statement running on the server, and the next call on that connection would queue behind
//!   it. Such a connection is never given back: its query is cancelled (a cancel request) and
//!   the connection closed, in a task of its own.
//! - **A connection that can no longer serve** is dropped, not given back: one whose server
//!   turned read-only (SQLSTATE 25006, a primary demoted; the retry opens a new connection, which
//!   `target_session_attrs=read-write` sends to the new primary), or one that failed. A
//!   connection idle for longer than [`VERIFY_IDLE`] is checked with an empty query when it is
//!   taken from the pool (one round trip, paid only after idleness: a firewall or a failover
//!   may have cut it silently), so that the call does not fail on it.
//! - **Statements**: prepared once per connection and cached by name (the default), or, behind a
//!   pooler in transaction mode, unnamed: `query_typed` sends parse, bind and execute in one round
//!   trip, so the statement never outlives the transaction the pooler lent the connection for.

// `Tls` is `NoTls`, a `Copy` type, without `postgres-tls`; `.clone()` serves both builds.
#![cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]

use std::time::Duration;

use bytes::BytesMut;
use deadpool_postgres::{Hook, HookError, Object, Pool};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::error::{decode, demoted, Failure};
use super::Tls;

/// How long a pooled connection may sit idle before it is checked when taken.
pub(crate) const VERIFY_IDLE: Duration = Duration::from_secs(30);

/// The pool hook that checks connections idle for longer than [`VERIFY_IDLE`].
pub(crate) fn verify_idle() -> Hook {
    Hook::async_fn(|client, metrics| {
        Box::pin(async move {
            if metrics.last_used() < VERIFY_IDLE {
                return Ok(());
            }
            client
                .simple_query("")
                .await
                .map(|_| ())
                .map_err(HookError::Backend)
        })
    })
}

/// A connection checked out for one attempt of a call.
pub(crate) struct Checkout {
    client: Option<Object>,
    tls: Tls,
}

impl Checkout {
    /// Takes a connection from the pool.
    pub(crate) async fn get(pool: &Pool, tls: &Tls) -> Result<Self, Failure> {
        Ok(Self {
            client: Some(pool.get().await?),
            tls: tls.clone(),
        })
    }

    /// Runs one statement that answers one row.
    pub(crate) async fn query_one(
        &self,
        unnamed: bool,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Failure> {
        let client = self.client()?;
        if unnamed {
            let mut rows = client.query_typed(sql, &typed(params)?).await?;
            if rows.len() != 1 {
                return Err(decode(format!(
                    "{} rows where one was expected",
                    rows.len()
                )));
            }
            Ok(rows.swap_remove(0))
        } else {
            let stmt = client.prepare_cached(sql).await?;
            Ok(client.query_one(&stmt, params).await?)
        }
    }

    /// Runs one statement for its effect.
    pub(crate) async fn execute(
        &self,
        unnamed: bool,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), Failure> {
        let client = self.client()?;
        if unnamed {
            client.query_typed(sql, &typed(params)?).await?;
        } else {
            let stmt = client.prepare_cached(sql).await?;
            client.execute(&stmt, params).await?;
        }
        Ok(())
    }

    /// Ends the attempt: the connection goes back to the pool unless `outcome` says it cannot
    /// serve another call.
    pub(crate) fn finish<T>(mut self, outcome: &Result<T, Failure>) {
        let Some(client) = self.client.take() else {
            return;
        };
        if let Err(Failure::Pg(e)) = outcome {
            if unfit(e) {
                // Closed when the last handle on it goes, here.
                drop(Object::take(client));
                return;
            }
        }
        drop(client);
    }

    fn client(&self) -> Result<&Object, Failure> {
        self.client
            .as_ref()
            .ok_or_else(|| decode("a finished checkout was used"))
    }
}

impl Drop for Checkout {
    /// Only reached with a connection when the attempt did not finish (its future was dropped):
    /// its statement may still run. Cancel it and close the connection, never pool it.
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let client = Object::take(client);
        let cancel = client.cancel_token();
        let tls = self.tls.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = cancel.cancel_query(tls).await;
                drop(client);
            });
        }
    }
}

/// Whether the connection behind error `e` cannot serve another call.
fn unfit(e: &tokio_postgres::Error) -> bool {
    e.is_closed() || demoted(e)
}

/// The types an unnamed statement declares for its parameters: for each, the first of the types
/// this crate passes that the value encodes as (the Rust types used map one to one).
fn typed<'a>(
    params: &'a [&'a (dyn ToSql + Sync)],
) -> Result<Vec<(&'a (dyn ToSql + Sync), Type)>, Failure> {
    const CANDIDATES: [Type; 10] = [
        Type::INT8,
        Type::INT4,
        Type::TEXT,
        Type::FLOAT8,
        Type::BOOL,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4_ARRAY,
        Type::JSONB,
        // A payload's body (`Option<&[u8]>`), sent in the binary format as every parameter.
        Type::BYTEA,
    ];
    let mut scratch = BytesMut::new();
    params
        .iter()
        .map(|p| {
            CANDIDATES
                .iter()
                .find(|ty| {
                    scratch.clear();
                    p.to_sql_checked(ty, &mut scratch).is_ok()
                })
                .map(|ty| (*p, ty.clone()))
                .ok_or_else(|| decode(format!("a parameter of no known type: {p:?}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_declare_the_types_they_encode_as() {
        let (a, b, c, d): (i64, &str, f64, Option<i32>) = (1, "x", 0.5, None);
        let v = vec![1i64, 2];
        let (body, none): (Option<&[u8]>, Option<&[u8]>) = (Some(&[0, 0xff][..]), None);
        let params: [&(dyn ToSql + Sync); 7] = [&a, &b, &c, &d, &v, &body, &none];
        let types: Vec<Type> = typed(&params)
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            types,
            [
                Type::INT8,
                Type::TEXT,
                Type::FLOAT8,
                Type::INT4,
                Type::INT8_ARRAY,
                Type::BYTEA,
                Type::BYTEA
            ]
        );
    }
}
