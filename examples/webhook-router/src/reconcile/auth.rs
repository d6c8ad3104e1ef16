//! How the reconciler authenticates to GitHub's REST API: as the App (a JWT signed RS256 with its
//! private key, minted again a minute before it expires) for the App's webhook, or with a token for
//! repository and organisation hooks.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

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

/// The App's credentials and the JWT minted last.
pub struct AppAuth {
    app_id: String,
    key: EncodingKey,
    minted: Mutex<Option<(String, SystemTime)>>,
}

impl std::fmt::Debug for AppAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppAuth")
            .field("app_id", &self.app_id)
            .field("key", &"<redacted>")
            .finish()
    }
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
        let key = EncodingKey::from_rsa_pem(pem)
            .map_err(|e| format!("the App key is not an RSA private key in PEM: {e}"))?;
        Ok(Self {
            app_id: app_id.to_owned(),
            key,
            minted: Mutex::new(None),
        })
    }

    /// A JWT valid for at least [`JWT_REFRESH_BEFORE`] more: the last one, or a new one.
    ///
    /// # Examples
    ///
    /// See [`new`](Self::new) (a key is needed to mint one).
    pub fn jwt(&self) -> Result<String, String> {
        let now = SystemTime::now();
        let mut minted = self
            .minted
            .lock()
            .map_err(|_| "the JWT cache is poisoned".to_owned())?;
        if let Some((jwt, expires)) = minted.as_ref() {
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
        let jwt = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)
            .map_err(|e| format!("cannot sign the App JWT: {e}"))?;
        *minted = Some((jwt.clone(), expires));
        Ok(jwt)
    }
}

/// How requests to one hook's delivery log are authenticated.
#[derive(Debug)]
pub enum Auth {
    /// As the App (its webhook's log).
    App(AppAuth),
    /// With a token (a repository's or organisation's hook).
    Token(String),
}

impl Auth {
    /// The `Authorization` header's value.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::auth::Auth;
    ///
    /// assert_eq!(Auth::Token("t".into()).header().unwrap(), "Bearer t");
    /// ```
    pub fn header(&self) -> Result<String, String> {
        match self {
            Self::App(app) => Ok(format!("Bearer {}", app.jwt()?)),
            Self::Token(t) => Ok(format!("Bearer {t}")),
        }
    }
}
