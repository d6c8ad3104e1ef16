//! The reconciler's flags (flattened into [`crate::cli::Args`]) and their validation into a
//! [`Config`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::api::Hook;
use super::{
    Config, DEFAULT_CHASE_BACKOFF, DEFAULT_PER_PAGE, DEFAULT_SETTLE, GITHUB_LOG_RETENTION,
};
use crate::reload::{self, Rotation, Watched};
use crate::secrets::{self, Secret};

/// Redelivery of failed deliveries from GitHub's hook logs (off unless an App or a hook is named).
#[derive(clap::Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// GitHub's REST API: <https://api.github.com>, or <https://HOST/api/v3> for GitHub Enterprise
    /// Server.
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_GITHUB_API_URL",
        default_value = "https://api.github.com"
    )]
    pub github_api_url: String,
    /// The GitHub App whose webhook's failed deliveries to redeliver (its id or client id);
    /// needs --github-app-key.
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_GITHUB_APP_ID",
        requires = "github_app_key"
    )]
    pub github_app_id: Option<String>,
    /// The App's private key, a PEM file (signs the RS256 JWT the App authenticates with), read
    /// again on SIGHUP and when it changes.
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_GITHUB_APP_KEY",
        requires = "github_app_id"
    )]
    pub github_app_key: Option<PathBuf>,
    /// A repository hook to reconcile, `OWNER/REPO:HOOK_ID` (repeatable); needs --github-token.
    #[arg(
        long = "github-repo-hook",
        env = "WEBHOOK_ROUTER_GITHUB_REPO_HOOKS",
        value_delimiter = ','
    )]
    pub github_repo_hooks: Vec<String>,
    /// An organisation hook to reconcile, `ORG:HOOK_ID` (repeatable); needs --github-token.
    #[arg(
        long = "github-org-hook",
        env = "WEBHOOK_ROUTER_GITHUB_ORG_HOOKS",
        value_delimiter = ','
    )]
    pub github_org_hooks: Vec<String>,
    /// A token that may read and redeliver the repository and organisation hooks' deliveries.
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_GITHUB_TOKEN",
        hide_env_values = true,
        conflicts_with = "github_token_file"
    )]
    pub github_token: Option<String>,
    /// A file holding that token, read again on SIGHUP and when it changes.
    #[arg(long, env = "WEBHOOK_ROUTER_GITHUB_TOKEN_FILE")]
    pub github_token_file: Option<PathBuf>,
    /// Certificates (a PEM file, one or more) to trust for the GitHub API beside the usual roots:
    /// GitHub Enterprise Server behind a private certificate authority.
    #[arg(long, env = "WEBHOOK_ROUTER_GITHUB_CA_BUNDLE")]
    pub github_ca_bundle: Option<PathBuf>,
    /// How often the reconciler reads the logs (e.g. `5m`, `90s`).
    #[arg(long, env = "WEBHOOK_ROUTER_RECONCILE_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconcile_interval: Duration,
    /// How far back it reads (at most GitHub's 3 days of log), e.g. `71h`.
    #[arg(long, env = "WEBHOOK_ROUTER_RECONCILE_HORIZON", default_value = "71h", value_parser = humantime::parse_duration)]
    pub reconcile_horizon: Duration,
}

fn hook_id(flag: &str, value: &str, id: &str) -> Result<u64, String> {
    id.parse::<u64>()
        .ok()
        .filter(|&i| i > 0)
        .ok_or_else(|| format!("{flag} {value:?}: the hook id {id:?} is not a positive number"))
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The token of repository and organisation hooks, from its flag or its file.
fn token(a: &ReconcileArgs) -> Result<Option<Secret>, String> {
    Ok(match (&a.github_token, &a.github_token_file) {
        (Some(t), _) if !t.is_empty() => Some(Secret::from(Some(t.as_str()))),
        (None, Some(path)) => {
            let value = secrets::read_file("--github-token-file", path)?;
            Some(Secret::new(Some(Arc::from(value))))
        }
        _ => None,
    })
}

/// The App's id and key, the key checked now (so a bad key stops the start rather than every
/// pass).
fn app(a: &ReconcileArgs) -> Result<Option<(String, Secret)>, String> {
    let (Some(id), Some(path)) = (&a.github_app_id, &a.github_app_key) else {
        return Ok(None);
    };
    let pem = secrets::read_file("--github-app-key", path)?;
    super::auth::check_key(&pem)
        .map_err(|e| format!("--github-app-key {}: {e}", path.display()))?;
    Ok(Some((id.clone(), Secret::new(Some(Arc::from(pem))))))
}

/// The extra roots for GitHub's API, checked now.
fn ca_bundle(a: &ReconcileArgs) -> Result<Option<Arc<[u8]>>, String> {
    let Some(path) = &a.github_ca_bundle else {
        return Ok(None);
    };
    let pem = secrets::read_file("--github-ca-bundle", path)?;
    super::api::http_client(Some(&pem))
        .map_err(|e| format!("--github-ca-bundle {}: {e}", path.display()))?;
    Ok(Some(Arc::from(pem)))
}

/// The reconciler's configuration, `None` when no App and no hook is named.
///
/// # Examples
///
/// ```
/// use clap::Parser;
/// use webhook_router::reconcile::flags::{config, ReconcileArgs};
///
/// #[derive(Parser)]
/// struct A {
///     #[command(flatten)]
///     r: ReconcileArgs,
/// }
/// let a = A::parse_from(["x"]);
/// assert!(config(&a.r).unwrap().is_none());
/// let a = A::parse_from(["x", "--github-repo-hook", "o/r:7", "--github-token", "t"]);
/// assert_eq!(config(&a.r).unwrap().unwrap().hooks.len(), 1);
/// let a = A::parse_from(["x", "--github-repo-hook", "o/r:7"]);
/// assert!(config(&a.r).unwrap_err().contains("--github-token"));
/// ```
pub fn config(a: &ReconcileArgs) -> Result<Option<Config>, String> {
    let mut hooks = Vec::new();
    for v in &a.github_repo_hooks {
        let flag = "--github-repo-hook";
        let (repo, id) = v
            .rsplit_once(':')
            .ok_or_else(|| format!("{flag} {v:?} is not OWNER/REPO:HOOK_ID"))?;
        match repo.split_once('/') {
            Some((o, r)) if name_ok(o) && name_ok(r) => {}
            _ => return Err(format!("{flag} {v:?}: {repo:?} is not OWNER/REPO")),
        }
        hooks.push(Hook::Repo {
            repo: repo.to_owned(),
            id: hook_id(flag, v, id)?,
        });
    }
    for v in &a.github_org_hooks {
        let flag = "--github-org-hook";
        let (org, id) = v
            .rsplit_once(':')
            .ok_or_else(|| format!("{flag} {v:?} is not ORG:HOOK_ID"))?;
        if !name_ok(org) {
            return Err(format!("{flag} {v:?}: {org:?} is not an organisation"));
        }
        hooks.push(Hook::Org {
            org: org.to_owned(),
            id: hook_id(flag, v, id)?,
        });
    }
    let token = token(a)?;
    if !hooks.is_empty() && token.is_none() {
        return Err(
            "--github-repo-hook and --github-org-hook need --github-token or --github-token-file"
                .into(),
        );
    }
    let app = app(a)?;
    if app.is_none() && hooks.is_empty() {
        return Ok(None);
    }
    if a.reconcile_interval < Duration::from_secs(1) {
        return Err("--reconcile-interval is under a second".into());
    }
    if a.reconcile_horizon.is_zero() || a.reconcile_horizon > GITHUB_LOG_RETENTION {
        return Err(format!(
            "--reconcile-horizon {} is outside GitHub's 3 days of delivery log",
            humantime::format_duration(a.reconcile_horizon)
        ));
    }
    let ca_bundle = ca_bundle(a)?;
    let api_url = a.github_api_url.trim_end_matches('/').to_owned();
    if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
        return Err(format!(
            "--github-api-url {api_url:?} is not an http(s) URL"
        ));
    }
    Ok(Some(Config {
        api_url,
        app,
        hooks,
        token,
        ca_bundle,
        interval: a.reconcile_interval,
        horizon: a.reconcile_horizon,
        settle: DEFAULT_SETTLE,
        per_page: DEFAULT_PER_PAGE,
        chase_backoff: DEFAULT_CHASE_BACKOFF,
    }))
}

/// The reconciler's secret files to read again on SIGHUP and when they change: the token file
/// and the App key of `c` (from `a`).
pub fn watched(a: &ReconcileArgs, c: &Config) -> Vec<Watched> {
    let mut out = Vec::new();
    if let (Some(path), Some(token)) = (&a.github_token_file, &c.token) {
        out.push(Watched {
            flag: "--github-token-file",
            path: path.clone(),
            secret: token.clone(),
            rotation: Rotation::Replace,
            check: reload::any_value,
        });
    }
    if let (Some(path), Some((_, pem))) = (&a.github_app_key, &c.app) {
        out.push(Watched {
            flag: "--github-app-key",
            path: path.clone(),
            secret: pem.clone(),
            rotation: Rotation::Replace,
            check: super::auth::check_key,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct A {
        #[command(flatten)]
        r: ReconcileArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<Config>, String> {
        let mut all = vec!["webhook-router"];
        all.extend_from_slice(args);
        config(&A::try_parse_from(all).map_err(|e| e.to_string())?.r)
    }

    #[test]
    fn hooks_horizons_and_keys_are_validated() {
        let hook = ["--github-org-hook", "octo-org:12", "--github-token", "t"];
        let c = parse(&hook).unwrap().unwrap();
        assert_eq!(
            c.hooks,
            [Hook::Org {
                org: "octo-org".into(),
                id: 12
            }]
        );
        assert_eq!(c.interval, Duration::from_secs(300));
        assert_eq!(c.horizon, Duration::from_secs(71 * 3600));
        assert_eq!(c.api_url, "https://api.github.com");
        for (bad, says) in [
            (vec!["--github-org-hook", "octo-org"], "ORG:HOOK_ID"),
            (vec!["--github-org-hook", "octo-org:0"], "positive"),
            (vec!["--github-org-hook", "a b:1"], "organisation"),
            (vec!["--github-repo-hook", "octo-org:1"], "OWNER/REPO"),
            (vec!["--github-repo-hook", "../x/y:1"], "OWNER/REPO"),
            (vec!["--reconcile-horizon", "73h"], "3 days"),
            (vec!["--reconcile-interval", "10ms"], "under a second"),
            (vec!["--github-api-url", "ftp://x"], "http(s)"),
            (
                vec!["--github-ca-bundle", "/nonexistent.pem"],
                "cannot read",
            ),
        ] {
            let mut args = hook.to_vec();
            args.extend(bad.iter().copied());
            // A later --github-org-hook adds to the first; every bad value is refused.
            let e = parse(&args).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let e = parse(&[
            "--github-app-id",
            "1",
            "--github-app-key",
            "/nonexistent.pem",
        ])
        .unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        assert!(
            parse(&["--github-app-id", "1"]).is_err(),
            "the key is required"
        );
    }
}
