//! How the reconciler authenticates to GitHub's REST API: as the App (a JWT signed RS256 with its
//! private key, minted again a minute before it expires) for the App's webhook, or with a token for
//! repository and organisation hooks.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::secrets::Secret;

/// How long a minted App JWT is valid (GitHub accepts at most ten minutes).
pub const JWT_LIFETIME: Duration = Duration::from_secs(9 * 60);
/// A JWT is minted again this long before it expires.
pub const JWT_REFRESH_BEFORE: Duration = Duration::from_secs(60);
/// `iat` is back-dated by this much, against clock drift (as GitHub recommends).
const JWT_BACKDATE: Duration = Duration::from_secs(60);

#[derive(Serialize)]
struct Claims<'a> {
    iat: u64,
    exp: u64,
    iss: &'a str,
}

/// The App's credentials and the JWT minted last. The key is a [`Secret`]: when its file is read
/// again with a new key, the next JWT is minted with it.
pub struct AppAuth {
    app_id: String,
    pem: Secret,
    state: Mutex<KeyState>,
}

/// The key in use (parsed from `pem`) and the JWT minted with it.
struct KeyState {
    pem: Arc<[u8]>,
    key: EncodingKey,
    minted: Option<(String, SystemTime)>,
}

impl std::fmt::Debug for AppAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppAuth")
            .field("app_id", &self.app_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

fn parse_key(pem: &[u8]) -> Result<EncodingKey, String> {
    EncodingKey::from_rsa_pem(pem)
        .map_err(|e| format!("the App key is not an RSA private key in PEM: {e}"))
}

/// Whether `pem` is a key [`AppAuth`] can sign with (the check of a key file read again).
///
/// # Examples
///
/// ```
/// assert!(webhook_router::reconcile::auth::check_key(b"not a key").is_err());
/// ```
pub fn check_key(pem: &[u8]) -> Result<(), String> {
    parse_key(pem).map(|_| ())
}

impl AppAuth {
    /// The App `app_id` (its numeric id or its client id) with its private key `pem` (the PEM
    /// file GitHub hands out, PKCS#1 or PKCS#8).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::auth::AppAuth;
    ///
    /// assert!(AppAuth::new("1", b"not a key").is_err());
    /// ```
    pub fn new(app_id: &str, pem: &[u8]) -> Result<Self, String> {
        Self::reloading(app_id, Secret::new(Some(Arc::from(pem))))
    }

    /// Like [`new`](Self::new), with the key read from `pem` at every mint (a new key is parsed
    /// once; one that does not parse is refused, and the last good one kept).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::auth::AppAuth;
    /// use webhook_router::secrets::Secret;
    ///
    /// assert!(AppAuth::reloading("1", Secret::default()).is_err());
    /// ```
    pub fn reloading(app_id: &str, pem: Secret) -> Result<Self, String> {
        let current = pem.current().ok_or("no App key")?;
        let key = parse_key(&current)?;
        Ok(Self {
            app_id: app_id.to_owned(),
            state: Mutex::new(KeyState {
                pem: current,
                key,
                minted: None,
            }),
            pem,
        })
    }

    /// A JWT valid for at least [`JWT_REFRESH_BEFORE`] more: the last one, or a new one (minted
    /// with the key read last).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::auth::AppAuth;
    ///
    /// let pem = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_github/app-key.pem")).unwrap();
    /// let auth = AppAuth::new("1", &pem).unwrap();
    /// let jwt = auth.jwt().unwrap();
    /// assert_eq!(jwt.split('.').count(), 3, "header, claims, signature");
    /// assert_eq!(auth.jwt().unwrap(), jwt, "reused while valid");
    /// ```
    pub fn jwt(&self) -> Result<String, String> {
        let now = SystemTime::now();
        let mut state = self
            .state
            .lock()
            .map_err(|_| "the JWT cache is poisoned".to_owned())?;
        if let Some(pem) = self.pem.current().filter(|p| !Arc::ptr_eq(p, &state.pem)) {
            match parse_key(&pem) {
                Ok(key) => {
                    *state = KeyState {
                        pem,
                        key,
                        minted: None,
                    }
                }
                Err(e) => tracing::error!("{e}: minting with the key read before"),
            }
        }
        if let Some((jwt, expires)) = state.minted.as_ref() {
            if now + JWT_REFRESH_BEFORE < *expires {
                return Ok(jwt.clone());
            }
        }
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let expires = now + JWT_LIFETIME;
        let claims = Claims {
            iat: secs(now - JWT_BACKDATE),
            exp: secs(expires),
            iss: &self.app_id,
        };
        let jwt = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &state.key)
            .map_err(|e| format!("cannot sign the App JWT: {e}"))?;
        state.minted = Some((jwt.clone(), expires));
        Ok(jwt)
    }
}

/// How requests to one hook's delivery log are authenticated.
#[derive(Debug)]
pub enum Auth {
    /// As the App (its webhook's log).
    App(AppAuth),
    /// With a token (a repository's or organisation's hook), sent as it is now (it may be read
    /// again from its file).
    Token(Secret),
}

impl Auth {
    /// The `Authorization` header's value.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::auth::Auth;
    ///
    /// use webhook_router::secrets::Secret;
    ///
    /// assert_eq!(Auth::Token(Secret::from(Some("t"))).header().unwrap(), "Bearer t");
    /// ```
    pub fn header(&self) -> Result<String, String> {
        match self {
            Self::App(app) => Ok(format!("Bearer {}", app.jwt()?)),
            Self::Token(t) => t
                .current_text()
                .map(|t| format!("Bearer {t}"))
                .ok_or_else(|| "no GitHub token".to_owned()),
        }
    }
}
