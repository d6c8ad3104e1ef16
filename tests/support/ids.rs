//! Worker ids as the differential tests compare them: by the order in which a history created
//! them, not by their value. Each backend chooses its own ids (the in-memory registry counts from
//! its clock's start, the shared backends from the server's clock, so that ids survive a loss of
//! the server's data); what must agree is which worker an answer names.

use worker_registry::{FencingToken, WorkerId};

/// One backend's ids, numbered 1, 2, ... in the order its answers first showed them (which is
/// the order the workers were created in: an answer names a worker only once it exists).
#[derive(Debug, Default)]
pub struct Ids {
    raw: Vec<u64>,
}

impl Ids {
    /// The worker a history's `k`-th id (1-based) names on this backend; an id no worker has
    /// (the same on every backend, and never handed out) when fewer were seen.
    pub fn arg(&self, k: u64) -> WorkerId {
        let at = usize::try_from(k).unwrap_or(usize::MAX).wrapping_sub(1);
        WorkerId::new(
            self.raw
                .get(at)
                .copied()
                .unwrap_or(WorkerId::MAX - k.min(1_000)),
        )
    }

    fn ordinal(&mut self, raw: u64) -> usize {
        match self.raw.iter().position(|&r| r == raw) {
            Some(i) => i + 1,
            None => {
                self.raw.push(raw);
                self.raw.len()
            }
        }
    }

    /// `s` with every `WorkerId(n)` written `W#k` and every `FencingToken(n)` `T#k.seq`, `k` the
    /// worker's ordinal.
    pub fn norm(&mut self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        loop {
            let w = rest.find("WorkerId(");
            let t = rest.find("FencingToken(");
            let (at, token) = match (w, t) {
                (None, None) => break,
                (Some(w), None) => (w, false),
                (None, Some(t)) => (t, true),
                (Some(w), Some(t)) => {
                    if t < w {
                        (t, true)
                    } else {
                        (w, false)
                    }
                }
            };
            let open = at + if token { 13 } else { 9 };
            let digits = rest[open..]
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len() - open);
            let Ok(n) = rest[open..open + digits].parse::<u64>() else {
                out.push_str(&rest[..open]);
                rest = &rest[open..];
                continue;
            };
            out.push_str(&rest[..at]);
            if token {
                let t = FencingToken::from_raw(n);
                let k = self.ordinal(t.worker().get());
                out.push_str(&format!("T#{k}.{}", t.seq()));
            } else if n > WorkerId::MAX - 1_000 {
                // An id `arg` made up: not a worker's, and no ordinal of its own (so that the
                // k-th ordinal stays the k-th worker created).
                out.push_str(&format!("W?{}", WorkerId::MAX - n));
            } else {
                let k = self.ordinal(n);
                out.push_str(&format!("W#{k}"));
            }
            // Skip the number and its closing parenthesis.
            let close = open + digits;
            rest = rest[close..].strip_prefix(')').unwrap_or(&rest[close..]);
        }
        out.push_str(rest);
        out
    }
}
