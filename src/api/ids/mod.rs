//! Identities: [`WorkerId`], [`Target`] (repository + PR/issue number), [`DeliveryId`] (GitHub's
//! `X-GitHub-Delivery`) and the [`FencingToken`]. Everything that comes from the network is validated here, once,
//! with a typed error that says what was seen.

mod delivery;
mod target;
mod worker;

pub use delivery::{DeliveryId, DeliveryIdError, MAX_DELIVERY_ID_LEN};
pub use target::{Target, TargetError, MAX_OWNER_LEN, MAX_REPO_NAME_LEN};
pub use worker::{FencingToken, WorkerId, WorkerIdError};

/// At most `max` bytes of `s`, cut on a character boundary (for error messages).
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owners GitHub produces, from each kind of account, are accepted.
    #[test]
    fn every_kind_of_github_owner_is_accepted() {
        for owner in [
            "octocat",
            "Octo-Org",
            "a",
            "0",
            "github-actions",
            "mona_octocorp",      // Enterprise Managed User: login + '_' + short code
            "mona-lisa_octocorp", // normalised EMU login with a hyphen
            "ab12_ACME1",
            "legacy-",      // older accounts may end with a hyphen ...
            "legacy--name", // ... or have two in a row
            "abcdefghijklmnopqrstuvwxyz0123456789abc", // 39 characters
        ] {
            let t = Target::new(&format!("{owner}/repo"), 1);
            assert!(t.is_ok(), "{owner}: {t:?}");
        }
        for name in [
            "repo", "my.repo", "my_repo", "-repo", ".github", "a..b", "UPPER",
        ] {
            assert!(Target::new(&format!("o/{name}"), 1).is_ok(), "{name}");
        }
    }

    /// Owners GitHub cannot produce are refused, each with its reason.
    #[test]
    fn owners_github_cannot_produce_are_refused() {
        for (owner, says) in [
            ("-mona", "starts with '-'"),
            ("_octocorp", "starts with '_'"),
            ("mona_", "ends with '_'"),
            ("mona_octo_corp", "more than one '_'"),
            ("mona_octo-corp", "short code"),
            ("-_x", "starts with '-'"),
        ] {
            let e = Target::new(&format!("{owner}/repo"), 1).unwrap_err();
            assert!(
                matches!(&e, TargetError::BadOwner { owner: o, .. } if o == owner),
                "{owner}: {e:?}"
            );
            assert!(e.to_string().contains(says), "{owner}: {e}");
        }
        for (owner, found) in [("mona.lisa", '.'), ("mona lisa", ' '), ("mönä", 'ö')] {
            assert_eq!(
                Target::new(&format!("{owner}/repo"), 1),
                Err(TargetError::BadCharacter {
                    part: "owner",
                    found
                })
            );
        }
        assert!(matches!(
            Target::new(&format!("{}_x/repo", "a".repeat(38)), 1),
            Err(TargetError::TooLong {
                part: "owner",
                len: 40,
                max: 39
            })
        ));
    }
}
