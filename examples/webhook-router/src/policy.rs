//! The routing policy: for each event (and action) that concerns a pull request, whether it
//! **starts** a worker for the PR when it has none, only **reaches** the PR's existing worker,
//! **drains** it (a closed or merged PR: the worker gets the event as its last one, then exits, and
//! none is started), or is **ignored**. [`DEFAULT_RULES`] is the table below (also in the README);
//! `--route event[.action]=decision` (repeatable, or `WEBHOOK_ROUTER_ROUTES` comma-separated)
//! overrides it. The decision is shown in every answer.
//!
//! The most specific rule wins: an override for `event.action`, then an override for `event`, then
//! the default for `event.action`, then the default for `event`.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use utoipa::ToSchema;

use crate::github::PR_EVENTS;

/// What a delivery does to its pull requests' workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Hand it to the PR's worker, starting one if the PR has none.
    Start,
    /// Hand it to the PR's worker if it has a live one; otherwise ignore it.
    Reach,
    /// Hand it to the PR's worker as its last event and drain the worker; start none.
    Drain,
    /// Do nothing.
    Ignore,
}

impl Decision {
    /// The name used in flags and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Reach => "reach",
            Self::Drain => "drain",
            Self::Ignore => "ignore",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Decision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "start" => Ok(Self::Start),
            "reach" => Ok(Self::Reach),
            "drain" => Ok(Self::Drain),
            "ignore" => Ok(Self::Ignore),
            other => Err(format!(
                "{other:?} is not a decision (start, reach, drain or ignore)"
            )),
        }
    }
}

/// The default policy: `(event, action or "*", decision)`. Events that ask for work (code pushed,
/// a PR opened, a comment or review written, CI finished, the merge queue asking for checks) start
/// a worker; the rest of a PR's chatter only reaches a running one; closing drains it.
pub const DEFAULT_RULES: &[(&str, &str, Decision)] = &[
    ("pull_request", "opened", Decision::Start),
    ("pull_request", "reopened", Decision::Start),
    ("pull_request", "synchronize", Decision::Start),
    ("pull_request", "ready_for_review", Decision::Start),
    ("pull_request", "edited", Decision::Start),
    ("pull_request", "closed", Decision::Drain),
    ("pull_request", "*", Decision::Reach),
    ("pull_request_review", "submitted", Decision::Start),
    ("pull_request_review", "*", Decision::Reach),
    ("pull_request_review_comment", "created", Decision::Start),
    ("pull_request_review_comment", "*", Decision::Reach),
    ("pull_request_review_thread", "*", Decision::Reach),
    ("issue_comment", "created", Decision::Start),
    ("issue_comment", "*", Decision::Reach),
    ("issues", "closed", Decision::Drain),
    ("issues", "*", Decision::Reach),
    ("check_run", "completed", Decision::Start),
    ("check_run", "*", Decision::Reach),
    ("check_suite", "completed", Decision::Start),
    ("check_suite", "*", Decision::Reach),
    ("workflow_run", "completed", Decision::Start),
    ("workflow_run", "*", Decision::Reach),
    ("merge_group", "checks_requested", Decision::Start),
    ("merge_group", "*", Decision::Reach),
];

/// The routing policy: the defaults plus overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    overrides: HashMap<(String, Option<String>), Decision>,
}

impl Policy {
    /// Adds an override from its flag form, `event=decision` or `event.action=decision`. The event
    /// must be one the router routes to pull requests ([`PR_EVENTS`]).
    pub fn with_rule(mut self, spec: &str) -> Result<Self, String> {
        let (key, decision) = spec
            .split_once('=')
            .ok_or_else(|| format!("--route {spec:?}: expected event[.action]=decision"))?;
        let decision: Decision = decision
            .trim()
            .parse()
            .map_err(|e| format!("--route {spec:?}: {e}"))?;
        let (event, action) = match key.trim().split_once('.') {
            Some((e, a)) if !a.is_empty() && a != "*" => (e, Some(a.to_owned())),
            Some((e, _)) => (e, None),
            None => (key.trim(), None),
        };
        if !PR_EVENTS.contains(&event) {
            return Err(format!(
                "--route {spec:?}: {event:?} is not an event routed to pull requests ({})",
                PR_EVENTS.join(", ")
            ));
        }
        self.overrides.insert((event.to_owned(), action), decision);
        Ok(self)
    }

    /// The decision for `event` with `action`.
    pub fn decide(&self, event: &str, action: Option<&str>) -> Decision {
        let key = |a: Option<&str>| (event.to_owned(), a.map(str::to_owned));
        if let Some(a) = action {
            if let Some(d) = self.overrides.get(&key(Some(a))) {
                return *d;
            }
        }
        if let Some(d) = self.overrides.get(&key(None)) {
            return *d;
        }
        let default = |want: &str| {
            DEFAULT_RULES
                .iter()
                .find(|(e, a, _)| *e == event && *a == want)
                .map(|(_, _, d)| *d)
        };
        action
            .and_then(default)
            .or_else(|| default("*"))
            .unwrap_or(Decision::Start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_start_on_work_reach_on_chatter_and_drain_on_close() {
        let p = Policy::default();
        assert_eq!(p.decide("pull_request", Some("opened")), Decision::Start);
        assert_eq!(
            p.decide("pull_request", Some("synchronize")),
            Decision::Start
        );
        assert_eq!(p.decide("pull_request", Some("closed")), Decision::Drain);
        assert_eq!(p.decide("pull_request", Some("labeled")), Decision::Reach);
        assert_eq!(p.decide("pull_request", None), Decision::Reach);
        assert_eq!(
            p.decide("pull_request_review_thread", Some("resolved")),
            Decision::Reach
        );
        assert_eq!(p.decide("check_run", Some("completed")), Decision::Start);
        assert_eq!(p.decide("check_run", Some("created")), Decision::Reach);
        assert_eq!(
            p.decide("merge_group", Some("checks_requested")),
            Decision::Start
        );
        // Every routed event has a catch-all row.
        for e in PR_EVENTS {
            assert!(
                DEFAULT_RULES.iter().any(|(ev, a, _)| *ev == e && *a == "*"),
                "{e}"
            );
        }
    }

    #[test]
    fn overrides_win_most_specific_first_and_bad_rules_are_refused() {
        let p = Policy::default()
            .with_rule("pull_request=ignore")
            .unwrap()
            .with_rule("pull_request.opened=reach")
            .unwrap()
            .with_rule("check_run.*=start")
            .unwrap();
        assert_eq!(p.decide("pull_request", Some("opened")), Decision::Reach);
        assert_eq!(p.decide("pull_request", Some("closed")), Decision::Ignore);
        assert_eq!(p.decide("check_run", Some("created")), Decision::Start);
        assert_eq!(p.decide("issues", Some("closed")), Decision::Drain);
        for bad in ["push=start", "pull_request", "pull_request=maybe", "=start"] {
            assert!(Policy::default().with_rule(bad).is_err(), "{bad}");
        }
    }
}
