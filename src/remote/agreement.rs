//! Configuration agreement for the networked backends: the limits that decide (capacity,
//! timeouts, retention, the brake) are stored with the registry by the first handle that opens
//! it; a handle configured differently is refused at connect with the first setting that
//! differs, both values named. (Adopting the stored values silently would make a replica behave
//! otherwise than its operator configured it; refusing makes the mismatch visible at deploy time.)
//! To change them, stop every replica, delete the stored value (Redis `{name}:config`, PostgreSQL
//! `wr_registries.config`), and start them with the new configuration.
//!
//! A setting added to the list after a registry stored its configuration ([`ADDED_LATER`]) is not
//! compared while the stored text lacks it: upgrading the library must not refuse every handle of
//! a running registry. It is compared once the stored configuration is written again (deleted
//! and stored by the next first handle, as above).

use crate::clock::millis;
use crate::config::RegistryConfig;

/// Settings added to [`settings`] after its first release (the payload limits, in 0.2): a stored
/// configuration without one of them agrees with any value of it.
pub(crate) const ADDED_LATER: [&str; 2] = ["max_payload_bytes", "payload_budget"];

/// The deciding settings of `c`, by name, as text (durations in ms).
pub(crate) fn settings(c: &RegistryConfig) -> Vec<(&'static str, String)> {
    let ms = |d| millis(d).to_string();
    vec![
        ("max_workers", c.max_workers().to_string()),
        ("heartbeat_timeout_ms", ms(c.heartbeat_timeout())),
        ("startup_grace_ms", ms(c.startup_grace())),
        ("sweep_interval_ms", ms(c.sweep_interval())),
        ("claim_retention_ms", ms(c.claim_retention())),
        ("max_retained_claims", c.max_retained_claims().to_string()),
        ("dead_retention_ms", ms(c.dead_retention())),
        ("suspect_grace_ms", ms(c.suspect_grace())),
        ("max_in_flight_ms", ms(c.max_in_flight())),
        ("release_ack_timeout_ms", ms(c.release_ack_timeout())),
        ("drain_deadline_ms", ms(c.drain_deadline())),
        ("brake_fraction", c.brake_fraction().to_string()),
        ("brake_min_workers", c.brake_min_workers().to_string()),
        ("max_payload_bytes", c.max_payload_bytes().to_string()),
        ("payload_budget", c.payload_budget().to_string()),
    ]
}

/// `settings` as stored: one `name=value` line each.
pub(crate) fn encode(settings: &[(&'static str, String)]) -> String {
    settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first of `ours` that the `stored` text gives another value (or none): its name, the
/// stored value (`(none)` if it has none) and ours.
pub(crate) fn disagreement(
    stored: &str,
    ours: &[(&'static str, String)],
) -> Option<(&'static str, String, String)> {
    let value = |name: &str| {
        stored.lines().find_map(|l| {
            l.split_once('=')
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| v)
        })
    };
    ours.iter().find_map(|(name, v)| match value(name) {
        Some(s) if s == v => None,
        None if ADDED_LATER.contains(name) => None,
        s => Some((*name, s.unwrap_or("(none)").to_owned(), v.clone())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_setting_that_differs_is_named_with_both_values() {
        let a = settings(&RegistryConfig::default());
        assert_eq!(disagreement(&encode(&a), &a), None);
        let b = settings(&RegistryConfig::builder().max_workers(3).build().unwrap());
        let (name, stored, ours) = disagreement(&encode(&a), &b).unwrap();
        assert_eq!((name, ours.as_str()), ("max_workers", "3"));
        assert_eq!(stored, RegistryConfig::default().max_workers().to_string());
        assert_eq!(disagreement("", &a).map(|d| d.1), Some("(none)".to_owned()));
    }

    #[test]
    fn a_configuration_stored_before_a_setting_existed_agrees_with_any_value_of_it() {
        let ours = settings(&RegistryConfig::default());
        let before: Vec<_> = ours
            .iter()
            .filter(|(k, _)| !ADDED_LATER.contains(k))
            .cloned()
            .collect();
        assert_eq!(disagreement(&encode(&before), &ours), None);
        // Stored, it is compared like any other.
        let other = settings(
            &RegistryConfig::builder()
                .payload_budget(1 << 30)
                .build()
                .unwrap(),
        );
        let (name, _, _) = disagreement(&encode(&ours), &other).unwrap();
        assert_eq!(name, "payload_budget");
        // A setting of the first release missing from the stored text is still a disagreement.
        let without_workers: Vec<_> = ours
            .iter()
            .filter(|(k, _)| *k != "max_workers")
            .cloned()
            .collect();
        let (name, stored, _) = disagreement(&encode(&without_workers), &ours).unwrap();
        assert_eq!((name, stored.as_str()), ("max_workers", "(none)"));
    }
}
