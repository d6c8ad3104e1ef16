//! GitHub webhook deliveries, in three parts: [`signature`](mod@signature) (the
//! `X-Hub-Signature-256` HMAC), [`headers`] (a delivery's identity, read and refused before the
//! body is read, and the [`Payload`](worker_registry::Payload) its worker gets) and
//! [`route`](mod@route) (the two content types' JSON document and the pull requests it concerns,
//! parsed with serde into small typed structs holding only what is used). Their items are
//! re-exported here.

pub mod headers;
pub mod route;
pub mod signature;

pub use headers::*;
pub use route::*;
pub use signature::*;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderMap, HeaderValue};
    use worker_registry::Target;

    fn one(action: &str, repo: &str, n: u64) -> Route {
        Route::Targets {
            action: Some(action.to_owned()),
            targets: vec![Target::new(repo, n).unwrap()],
        }
    }

    #[test]
    fn signature_round_trips_and_rejects_tampering() {
        let body = br#"{"zen":"Keep it logically awesome."}"#;
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, sign(b"s3cret", body).parse().unwrap());
        assert_eq!(verify(b"s3cret", &h, body), Ok(()));
        assert_eq!(verify(b"other", &h, body), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"s3cret", &h, b"{}"), Err(SignatureError::Mismatch));
        h.append(SIGNATURE_HEADER, sign(b"s3cret", body).parse().unwrap());
        assert_eq!(signature(&h), Err(SignatureError::Malformed), "twice");
        h.insert(SIGNATURE_HEADER, HeaderValue::from_static("sha1=abcd"));
        assert_eq!(verify(b"s3cret", &h, body), Err(SignatureError::Malformed));
        h.remove(SIGNATURE_HEADER);
        assert_eq!(verify(b"s3cret", &h, body), Err(SignatureError::Missing));
    }

    #[test]
    fn github_documented_signature_example() {
        // The example from GitHub's "Validating webhook deliveries" page.
        let sig = sign(b"It's a Secret to Everybody", b"Hello, World!");
        assert_eq!(
            sig,
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn content_types_are_case_insensitive_with_parameters() {
        let ct = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            content_type(&h)
        };
        assert_eq!(ct("application/json"), Ok(ContentType::Json));
        assert_eq!(ct("Application/JSON; charset=utf-8"), Ok(ContentType::Json));
        assert_eq!(
            ct("Application/X-WWW-Form-Urlencoded"),
            Ok(ContentType::Form)
        );
        assert_eq!(
            ct(" application/x-www-form-urlencoded ;charset=UTF-8"),
            Ok(ContentType::Form)
        );
        assert!(matches!(
            ct("text/plain"),
            Err(HeaderError::UnsupportedContentType(_))
        ));
        assert!(matches!(
            ct("application/jsonx"),
            Err(HeaderError::UnsupportedContentType(_))
        ));
        assert_eq!(
            content_type(&HeaderMap::new()),
            Err(HeaderError::Missing("Content-Type"))
        );
    }

    #[test]
    fn repeated_identity_headers_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(EVENT_HEADER, HeaderValue::from_static("push"));
        h.insert(DELIVERY_HEADER, HeaderValue::from_static("a"));
        assert!(delivery(&h).is_ok());
        h.append(DELIVERY_HEADER, HeaderValue::from_static("b"));
        assert_eq!(
            delivery(&h).unwrap_err(),
            HeaderError::Repeated("X-GitHub-Delivery")
        );
        h.remove(DELIVERY_HEADER);
        h.insert(DELIVERY_HEADER, HeaderValue::from_static("a"));
        h.append(EVENT_HEADER, HeaderValue::from_static("pull_request"));
        assert_eq!(
            delivery(&h).unwrap_err(),
            HeaderError::Repeated("X-GitHub-Event")
        );
    }

    #[test]
    fn form_payloads_are_decoded_without_a_size_limit_of_their_own() {
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(3 << 20));
        let body = format!(
            "payload={}",
            big.replace('"', "%22")
                .replace('{', "%7B")
                .replace('}', "%7D")
        );
        assert_eq!(
            &*json_payload(ContentType::Form, body.as_bytes()).unwrap(),
            big.as_bytes()
        );
        assert!(json_payload(ContentType::Form, b"other=1").is_err());
        assert!(json_payload(ContentType::Form, b"payload=1&payload=2").is_err());
    }

    #[test]
    fn routes_every_event_that_names_a_pull_request() {
        let pr = br#"{"action":"opened","number":5,"repository":{"full_name":"Octo/Repo"},"pull_request":{"number":5}}"#;
        assert_eq!(
            route("pull_request", pr).unwrap(),
            one("opened", "octo/repo", 5)
        );
        let thread = br#"{"action":"resolved","repository":{"full_name":"o/r"},"pull_request":{"number":3},"thread":{"comments":[]}}"#;
        assert_eq!(
            route("pull_request_review_thread", thread).unwrap(),
            one("resolved", "o/r", 3)
        );
        let on_pr = br#"{"action":"labeled","repository":{"full_name":"o/r"},"issue":{"number":9,"pull_request":{"url":"x"}}}"#;
        assert_eq!(route("issues", on_pr).unwrap(), one("labeled", "o/r", 9));
        assert_eq!(
            route("issue_comment", on_pr).unwrap(),
            one("labeled", "o/r", 9)
        );
        let on_issue = br#"{"repository":{"full_name":"o/r"},"issue":{"number":9}}"#;
        assert!(matches!(
            route("issues", on_issue).unwrap(),
            Route::Ignored(_)
        ));

        let ci = br#"{"action":"completed","repository":{"id":1,"full_name":"o/r"},
            "check_run":{"pull_requests":[
                {"number":2,"base":{"repo":{"id":1,"url":"https://api.github.com/repos/o/r","name":"r"}}},
                {"number":7,"base":{"repo":{"id":9,"url":"https://api.github.com/repos/up/stream","name":"stream"}}},
                {"number":2,"base":{"repo":{"id":1,"url":"https://api.github.com/repos/o/r","name":"r"}}}]}}"#;
        assert_eq!(
            route("check_run", ci).unwrap(),
            Route::Targets {
                action: Some("completed".into()),
                targets: vec![
                    Target::new("o/r", 2).unwrap(),
                    Target::new("up/stream", 7).unwrap()
                ]
            }
        );
        let suite = br#"{"action":"completed","repository":{"full_name":"o/r"},"check_suite":{"pull_requests":[{"number":4}]}}"#;
        assert_eq!(
            route("check_suite", suite).unwrap(),
            one("completed", "o/r", 4)
        );
        let run = br#"{"action":"completed","repository":{"full_name":"o/r"},"workflow_run":{"pull_requests":[]}}"#;
        assert!(matches!(
            route("workflow_run", run).unwrap(),
            Route::Ignored(_)
        ));
        assert!(matches!(
            route("workflow_run", br#"{"repository":{"full_name":"o/r"}}"#),
            Err(PayloadError::Json { .. })
        ));

        let queue = br#"{"action":"checks_requested","repository":{"full_name":"o/r"},
            "merge_group":{"head_ref":"refs/heads/gh-readonly-queue/release/1.x/pr-123-0123456789abcdef0123456789abcdef01234567"}}"#;
        assert_eq!(
            route("merge_group", queue).unwrap(),
            one("checks_requested", "o/r", 123)
        );
        assert_eq!(
            merge_queue_number("gh-readonly-queue/main/pr-9-abc"),
            Some(9)
        );
        assert_eq!(merge_queue_number("feature/pr-9-abc"), None);
        assert_eq!(merge_queue_number("gh-readonly-queue/main/pr--abc"), None);

        assert!(matches!(route("push", b"{}").unwrap(), Route::Ignored(_)));
        for not_an_object in [&b"8115548734529121.0"[..], b"[]", b"\"x\"", b"null"] {
            assert!(matches!(
                route("push", not_an_object),
                Err(PayloadError::Json { .. })
            ));
        }
        assert!(matches!(
            route("push", b"{"),
            Err(PayloadError::Json { .. })
        ));
        assert!(matches!(
            route("pull_request", br#"{"repository":{"full_name":"o/r"}}"#),
            Err(PayloadError::Json { .. })
        ));
        assert!(matches!(
            route(
                "pull_request",
                br#"{"repository":{"full_name":"no-slash"},"pull_request":{"number":1}}"#
            ),
            Err(PayloadError::Target(_))
        ));
    }
}
