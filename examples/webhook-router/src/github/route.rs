//! Where a delivery goes: its JSON document (either content type) and the pull requests it
//! concerns.

use std::fmt;

use serde::de::IgnoredAny;
use serde::Deserialize;
use worker_registry::{Target, TargetError};

use super::headers::*;

/// The JSON document of a delivery: the body itself (not copied), or the `payload` field of a
/// form-encoded body (decoded here, so the same 25 MiB cap holds for both content types).
pub fn json_payload(
    content_type: ContentType,
    body: &[u8],
) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    match content_type {
        ContentType::Json => Ok(std::borrow::Cow::Borrowed(body)),
        ContentType::Form => {
            let mut payload = None;
            for (key, value) in form_urlencoded::parse(body) {
                if key == "payload" {
                    if payload.is_some() {
                        return Err(
                            "form-encoded delivery: `payload` appears more than once".to_owned()
                        );
                    }
                    payload = Some(value.into_owned().into_bytes());
                }
            }
            payload
                .map(std::borrow::Cow::Owned)
                .ok_or_else(|| "form-encoded delivery: no `payload` field".to_owned())
        }
    }
}

/// Where a delivery goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// One or more pull requests (deduplicated, in order): hand the delivery to each one's worker.
    Targets {
        /// The payload's `action`, if it has one.
        action: Option<String>,
        /// The pull requests.
        targets: Vec<Target>,
    },
    /// Nothing to do (push, ping, a comment on an issue...): why.
    Ignored(String),
}

/// A payload that is not what its event promises (answered with 400).
#[derive(Debug)]
#[non_exhaustive]
pub enum PayloadError {
    /// Not JSON, or JSON without the fields this event must have.
    Json {
        /// The event name.
        event: String,
        /// serde's message (with line and column).
        source: serde_json::Error,
    },
    /// The repository name or number is not a valid target.
    Target(TargetError),
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json { event, source } => write!(f, "{event} payload: {source}"),
            Self::Target(e) => write!(f, "payload target: {e}"),
        }
    }
}

#[derive(Deserialize)]
struct Repository {
    full_name: String,
    #[serde(default)]
    id: Option<u64>,
}

#[derive(Deserialize)]
struct Numbered {
    number: u64,
}

/// `pull_request`, `pull_request_review`, `pull_request_review_comment`,
/// `pull_request_review_thread`.
#[derive(Deserialize)]
struct PullRequestPayload {
    action: Option<String>,
    repository: Repository,
    pull_request: Numbered,
}

#[derive(Deserialize)]
struct Issue {
    number: u64,
    /// Present (an object of links) only when the issue is a pull request.
    pull_request: Option<IgnoredAny>,
}

/// `issue_comment`, `issues`.
#[derive(Deserialize)]
struct IssuePayload {
    action: Option<String>,
    repository: Repository,
    issue: Issue,
}

/// The base repository of a pull request as `check_run` & co. describe it: no `full_name`, an API
/// URL (`https://api.github.com/repos/{owner}/{name}`) and an id.
#[derive(Deserialize)]
struct BaseRepo {
    id: Option<u64>,
    url: Option<String>,
}

#[derive(Deserialize)]
struct Base {
    repo: Option<BaseRepo>,
}

#[derive(Deserialize)]
struct LinkedPullRequest {
    number: u64,
    base: Option<Base>,
}

#[derive(Deserialize)]
struct WithPullRequests {
    #[serde(default)]
    pull_requests: Vec<LinkedPullRequest>,
}

/// `check_run`, `check_suite`, `workflow_run`: the object named like the event carries the pull
/// requests it ran for.
#[derive(Deserialize)]
struct CiPayload {
    action: Option<String>,
    repository: Repository,
    check_run: Option<WithPullRequests>,
    check_suite: Option<WithPullRequests>,
    workflow_run: Option<WithPullRequests>,
}

#[derive(Deserialize)]
struct MergeGroup {
    head_ref: String,
}

/// `merge_group`: the queued pull request is named only in the temporary branch.
#[derive(Deserialize)]
struct MergeGroupPayload {
    action: Option<String>,
    repository: Repository,
    merge_group: MergeGroup,
}

/// The pull-request number in a merge queue branch, `gh-readonly-queue/<base>/pr-<N>-<sha>` (the
/// base may contain slashes; `refs/heads/` may precede it).
pub fn merge_queue_number(head_ref: &str) -> Option<u64> {
    let rest = head_ref
        .strip_prefix("refs/heads/")
        .unwrap_or(head_ref)
        .strip_prefix("gh-readonly-queue/")?;
    let last = rest.rsplit('/').next()?;
    let digits = last.strip_prefix("pr-")?.split('-').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `owner/name` from a repository API URL (`.../repos/{owner}/{name}`).
fn repo_from_api_url(url: &str) -> Option<String> {
    let (_, path) = url.split_once("/repos/")?;
    let mut parts = path.trim_end_matches('/').splitn(3, '/');
    let (owner, name) = (parts.next()?, parts.next()?);
    (parts.next().is_none() && !owner.is_empty() && !name.is_empty())
        .then(|| format!("{owner}/{name}"))
}

/// The events this router routes to a pull request's worker.
pub const PR_EVENTS: [&str; 10] = [
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "issue_comment",
    "issues",
    "check_run",
    "check_suite",
    "workflow_run",
    "merge_group",
];

/// Finds the pull requests a delivery of `event` concerns from its JSON `body`.
///
/// Every body must be a JSON object (even for ignored events); the events that concern a pull
/// request must carry the fields naming it.
pub fn route(event: &str, body: &[u8]) -> Result<Route, PayloadError> {
    let json_err = json_error(event);
    match event {
        "pull_request"
        | "pull_request_review"
        | "pull_request_review_comment"
        | "pull_request_review_thread" => {
            let p: PullRequestPayload = serde_json::from_slice(body).map_err(json_err)?;
            Ok(targets(
                p.action,
                vec![target(&p.repository.full_name, p.pull_request.number)?],
            ))
        }
        "issue_comment" | "issues" => {
            let p: IssuePayload = serde_json::from_slice(body).map_err(json_err)?;
            if p.issue.pull_request.is_some() {
                Ok(targets(
                    p.action,
                    vec![target(&p.repository.full_name, p.issue.number)?],
                ))
            } else {
                Ok(Route::Ignored(format!(
                    "{event} on issue #{}, not on a pull request",
                    p.issue.number
                )))
            }
        }
        "check_run" | "check_suite" | "workflow_run" => ci_route(event, body),
        "merge_group" => {
            let p: MergeGroupPayload = serde_json::from_slice(body).map_err(json_err)?;
            match merge_queue_number(&p.merge_group.head_ref) {
                Some(n) => Ok(targets(p.action, vec![target(&p.repository.full_name, n)?])),
                None => Ok(Route::Ignored(format!(
                    "merge_group head_ref {:?} names no pull request",
                    p.merge_group.head_ref.chars().take(200).collect::<String>()
                ))),
            }
        }
        other => {
            // Every GitHub payload is a JSON object, whatever its event.
            serde_json::from_slice::<std::collections::BTreeMap<String, IgnoredAny>>(body)
                .map_err(json_err)?;
            Ok(Route::Ignored(if other == "ping" {
                "ping: the webhook is set up".to_owned()
            } else {
                format!("{other} events have no pull-request target")
            }))
        }
    }
}

/// The pull requests a `check_run`, `check_suite` or `workflow_run` ran for: each in its base
/// repository, which is the delivery's unless the payload says otherwise.
fn ci_route(event: &str, body: &[u8]) -> Result<Route, PayloadError> {
    let json_err = json_error(event);
    let p: CiPayload = serde_json::from_slice(body).map_err(&json_err)?;
    let run = match event {
        "check_run" => p.check_run,
        "check_suite" => p.check_suite,
        _ => p.workflow_run,
    };
    let Some(run) = run else {
        return Err(json_err(serde::de::Error::missing_field(match event {
            "check_run" => "check_run",
            "check_suite" => "check_suite",
            _ => "workflow_run",
        })));
    };
    if run.pull_requests.is_empty() {
        return Ok(Route::Ignored(format!(
            "{event} for no pull request (pull_requests is empty: a push, or a pull request from a fork)"
        )));
    }
    let mut found = Vec::with_capacity(run.pull_requests.len());
    for pr in run.pull_requests {
        let base = pr.base.and_then(|b| b.repo);
        // The pull request lives in its base repository, which is the delivery's repository
        // unless the payload says otherwise.
        let repo = match base {
            Some(b) if b.id.is_some() && b.id != p.repository.id => b
                .url
                .as_deref()
                .and_then(repo_from_api_url)
                .unwrap_or_else(|| p.repository.full_name.clone()),
            _ => p.repository.full_name.clone(),
        };
        found.push(target(&repo, pr.number)?);
    }
    Ok(targets(p.action, found))
}

/// Turns serde's error on a payload of `event` into a [`PayloadError`].
fn json_error(event: &str) -> impl Fn(serde_json::Error) -> PayloadError + '_ {
    move |source| PayloadError::Json {
        event: event.to_owned(),
        source,
    }
}

fn target(repo: &str, number: u64) -> Result<Target, PayloadError> {
    Target::new(repo, number).map_err(PayloadError::Target)
}

/// A route to `targets`, each once, in order.
fn targets(action: Option<String>, targets: Vec<Target>) -> Route {
    let mut unique: Vec<Target> = Vec::with_capacity(targets.len());
    for t in targets {
        if !unique.contains(&t) {
            unique.push(t);
        }
    }
    Route::Targets {
        action,
        targets: unique,
    }
}
