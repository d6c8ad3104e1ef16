//! Calling the Function library: the arguments every function takes (`prepare`), the call
//! (`invoke`), and the reply of a call that may publish events (`{events, reply, epoch}`), whose
//! events reach this handle's subscribers before its caller has the reply.

use ::redis::Value;

use super::codec::{self, bad, Reply};
use super::counters::C;
use super::error;
use super::scripts::{Call, Function};
use super::RedisRegistry;
use crate::api::error::RegistryError;

impl RedisRegistry {
    /// A call of `function` with the arguments every function takes (the offset key, the
    /// prefix, this replica's id).
    pub(crate) fn prepare(&self, function: &Function) -> Call {
        let mut inv = function.key(&self.inner.keys.clock);
        inv.arg(&self.inner.keys.prefix).arg(&self.inner.replica);
        inv
    }

    /// Calls a function and answers its reply; a failed connection is a backend error.
    pub(crate) async fn invoke(&self, inv: &Call) -> Result<Value, RegistryError> {
        let mut conn = self.inner.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(error::backend)
    }

    /// Invokes a script that may publish events (its reply is `{events, reply, epoch}`) and
    /// returns the reply once this handle's subscribers have had the events, in order, as the
    /// in-memory registry's would (see `events.rs`).
    pub(crate) async fn invoke_emitting(&self, inv: &Call) -> Result<Value, RegistryError> {
        let (v, promoted) = self.invoke_sweeping(inv).await?;
        if promoted {
            self.inner.wake.notify();
        }
        Ok(v)
    }

    /// [`invoke_emitting`](Self::invoke_emitting) for the sweep's own steps (which hand out what
    /// they promote themselves): also whether the call promoted waiting deliveries.
    pub(crate) async fn invoke_sweeping(&self, inv: &Call) -> Result<(Value, bool), RegistryError> {
        let v = self.invoke(inv).await?;
        let mut parts = match v {
            Value::Array(parts) => parts,
            // A call that emitted nothing answers its reply bare; a packed one is a string.
            packed @ Value::BulkString(_) => return Ok((packed, false)),
            other => {
                return Err(bad(format!(
                    "expected {{events, reply, epoch}}, got {other:?}"
                )))
            }
        };
        // A bare name/value array's first element is a name, where {events, reply, epoch} starts
        // with an array (scripts/lib_base.lua `finish`).
        if matches!(
            parts.first(),
            Some(Value::BulkString(_) | Value::SimpleString(_))
        ) {
            return Ok((Value::Array(parts), false));
        }
        if parts.len() != 3 {
            return Err(bad(format!(
                "expected {{events, reply, epoch}}, got {} parts",
                parts.len()
            )));
        }
        let epoch = match parts.pop() {
            Some(Value::BulkString(b)) => {
                Some(String::from_utf8(b).map_err(|e| bad(format!("epoch: {e}")))?)
            }
            _ => None,
        };
        let reply = parts.pop().unwrap_or(Value::Nil);
        let mut events = Reply::of(&parts[0])?;
        let mut own = Vec::with_capacity(events.remaining());
        let mut promoted = false;
        while events.remaining() > 0 {
            let text = events.text()?;
            let event = codec::decode_event(&text)?;
            if let crate::Event::DeliveryPromoted { .. } = event.1 {
                // This replica's promotion (at a death of its call, or in its sweep's waiting
                // step), counted as the admission it is (the event's last field: a new worker).
                promoted = true;
                let c = &self.inner.counters;
                c.inc(C::Promoted);
                c.inc(if text.ends_with("\t1") {
                    C::AdmittedNew
                } else {
                    C::AdmittedSticky
                });
            }
            own.push(event);
        }
        self.inner.events.settle(epoch.as_deref(), own).await;
        Ok((reply, promoted))
    }
}
