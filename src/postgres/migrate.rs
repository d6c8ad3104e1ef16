//! The embedded schema and functions. The versioned migrations (SQL files under `migrations/`,
//! schema changes) are applied in order, each once, recorded in `wr_schema_migrations`; then the
//! current functions (`functions.sql`, one file, every definition `CREATE OR REPLACE`) are
//! applied if their checksum differs from the one recorded in `wr_functions`. All of it in one
//! transaction under an advisory lock, so that replicas starting together apply it once.

use tokio_postgres::Client;

use super::error::{decode, Failure};

/// One migration: its version, a name, and its SQL.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema",
        sql: include_str!("migrations/0001_schema.sql"),
    },
    Migration {
        version: 2,
        name: "functions",
        sql: include_str!("migrations/0002_functions.sql"),
    },
    Migration {
        version: 3,
        name: "lifecycle",
        sql: include_str!("migrations/0003_lifecycle.sql"),
    },
    Migration {
        version: 4,
        name: "retained_counter",
        sql: include_str!("migrations/0004_retained_counter.sql"),
    },
    Migration {
        version: 5,
        name: "lease_and_versions",
        sql: include_str!("migrations/0005_lease_and_versions.sql"),
    },
    Migration {
        version: 6,
        name: "identity",
        sql: include_str!("migrations/0006_identity.sql"),
    },
    Migration {
        version: 7,
        name: "event_log",
        sql: include_str!("migrations/0007_event_log.sql"),
    },
    Migration {
        version: 8,
        name: "waiting_room",
        sql: include_str!("migrations/0008_waiting_room.sql"),
    },
    Migration {
        version: 9,
        name: "payloads",
        sql: include_str!("migrations/0009_payloads.sql"),
    },
];

/// The current functions, applied after the migrations whenever [`functions_checksum`] changes.
pub(crate) const FUNCTIONS: &str = include_str!("functions.sql");

/// How long the migration transaction waits for a lock (the advisory lock while another replica
/// migrates, a table lock a migration takes) before it fails and is retried.
pub(crate) const MIGRATION_LOCK_TIMEOUT: &str = "60s";
/// How long one statement of the migration transaction may run (a migration may scan a table).
pub(crate) const MIGRATION_STATEMENT_TIMEOUT: &str = "10min";

/// The checksum `wr_functions` records: FNV-1a (64 bits) of [`FUNCTIONS`], in hex.
pub(crate) fn functions_checksum() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in FUNCTIONS.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The advisory lock (one bigint key: "wr-migr" in ASCII) that serialises migrations.
const MIGRATION_LOCK: i64 = 0x0077_722d_6d69_6772;

/// Applies the migrations the database does not have yet; returns their versions.
pub(crate) async fn apply(client: &mut Client) -> Result<Vec<i32>, Failure> {
    let tx = client.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'; \
         SET LOCAL statement_timeout = '{MIGRATION_STATEMENT_TIMEOUT}'"
    ))
    .await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS wr_schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE IF NOT EXISTS wr_functions (
             one        boolean PRIMARY KEY DEFAULT true CHECK (one),
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let mut applied = Vec::new();
    for row in tx
        .query("SELECT version FROM wr_schema_migrations", &[])
        .await?
    {
        applied.push(
            row.try_get::<_, i32>(0)
                .map_err(|e| decode(format!("wr_schema_migrations.version: {e}")))?,
        );
    }
    let mut done = Vec::new();
    for m in MIGRATIONS {
        if applied.contains(&m.version) {
            continue;
        }
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO wr_schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await?;
        done.push(m.version);
    }
    let checksum = functions_checksum();
    let current = tx
        .query_opt("SELECT checksum FROM wr_functions", &[])
        .await?
        .map(|row| row.try_get::<_, String>(0))
        .transpose()
        .map_err(|e| decode(format!("wr_functions.checksum: {e}")))?;
    if current.as_deref() != Some(checksum.as_str()) {
        tx.batch_execute(FUNCTIONS).await?;
        tx.execute(
            "INSERT INTO wr_functions (one, checksum) VALUES (true, $1) \
             ON CONFLICT (one) DO UPDATE SET checksum = $1, applied_at = now()",
            &[&checksum],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::{functions_checksum, FUNCTIONS, MIGRATIONS};

    #[test]
    fn versions_increase_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "{}", m.name);
        }
    }

    #[test]
    fn the_functions_file_defines_each_function_once_and_replaceably() {
        let mut names = Vec::new();
        for line in FUNCTIONS.lines() {
            if let Some(rest) = line.strip_prefix("CREATE ") {
                assert!(rest.starts_with("OR REPLACE FUNCTION "), "{line}");
                let name = rest["OR REPLACE FUNCTION ".len()..]
                    .split('(')
                    .next()
                    .unwrap()
                    .to_owned();
                assert!(!names.contains(&name), "{name} defined twice");
                names.push(name);
            }
        }
        assert!(names.len() > 30, "{names:?}");
        assert_eq!(functions_checksum().len(), 16);
    }
}
