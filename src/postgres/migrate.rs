//! The embedded schema and functions. The versioned migrations (SQL files under `migrations/`,
//! schema changes, starting from `0001_baseline.sql`) are applied in order, each once, recorded
//! in `wr_schema_migrations` (a database of the old history, 0001-0009, is recorded as at the
//! baseline if it reached 0009, and refused before: [`SchemaTooOld`]); then the
//! current functions (`functions/*.sql`, split by concern, every definition `CREATE OR REPLACE`)
//! are applied, in a fixed order, if their checksum differs from the one recorded in
//! `wr_functions`. All of it in one
//! transaction under an advisory lock, so that replicas starting together apply it once.

use tokio_postgres::{Client, Transaction};

use super::error::{decode, Failure, SchemaTooOld, OLD_HISTORY_LAST};

/// One migration: its version, a name, and its SQL.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration, oldest first. Version 1 is the baseline: the schema as the old history
/// (0001-0009, before 0.2.0) left it.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: BASELINE,
    sql: include_str!("migrations/0001_baseline.sql"),
}];

/// The name the baseline is recorded under in `wr_schema_migrations`.
const BASELINE: &str = "baseline";

/// The name the old history recorded its version 1 under: a database whose version 1 has it was
/// migrated by the old files.
const OLD_HISTORY_FIRST: &str = "schema";

/// The current functions, split by concern like the Redis backend's Lua library, in the order
/// they are applied (after the migrations, whenever [`functions_checksum`] changes): name, SQL.
/// `base` first (what the others use); a `LANGUAGE sql` function must come after the functions
/// its body calls, a PL/pgSQL one may come anywhere.
pub(crate) const FUNCTION_FILES: &[(&str, &str)] = &[
    ("base", include_str!("functions/base.sql")),
    ("payloads", include_str!("functions/payloads.sql")),
    ("waiting", include_str!("functions/waiting.sql")),
    ("workers", include_str!("functions/workers.sql")),
    ("claims", include_str!("functions/claims.sql")),
    ("sweep", include_str!("functions/sweep.sql")),
    ("snapshot", include_str!("functions/snapshot.sql")),
    ("outbox", include_str!("functions/outbox.sql")),
];

/// How long the migration transaction waits for a lock (the advisory lock while another replica
/// migrates, a table lock a migration takes) before it fails and is retried.
pub(crate) const MIGRATION_LOCK_TIMEOUT: &str = "60s";
/// How long one statement of the migration transaction may run (a migration may scan a table).
pub(crate) const MIGRATION_STATEMENT_TIMEOUT: &str = "10min";

/// The checksum `wr_functions` records: FNV-1a (64 bits) of the [`FUNCTION_FILES`] in order,
/// each followed by a NUL (so that moving a function between files changes it), in hex.
pub(crate) fn functions_checksum() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in FUNCTION_FILES
        .iter()
        .flat_map(|(_, sql)| sql.bytes().chain([0]))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The advisory lock (one bigint key: "wr-migr" in ASCII) that serialises migrations.
const MIGRATION_LOCK: i64 = 0x0077_722d_6d69_6772;

/// The versions the database has. A database the old history (0001-0009) migrated is rewritten
/// as at the baseline when it reached 0009 (the schema is the same; its functions are replaced
/// next, as on every change), and refused with [`SchemaTooOld`] before that.
async fn from_old_history(tx: &Transaction<'_>) -> Result<Vec<i32>, Failure> {
    let mut rows = Vec::new();
    for row in tx
        .query("SELECT version, name FROM wr_schema_migrations", &[])
        .await?
    {
        let version = row
            .try_get::<_, i32>(0)
            .map_err(|e| decode(format!("wr_schema_migrations.version: {e}")))?;
        let name = row
            .try_get::<_, String>(1)
            .map_err(|e| decode(format!("wr_schema_migrations.name: {e}")))?;
        rows.push((version, name));
    }
    if !rows.iter().any(|(v, n)| *v == 1 && n == OLD_HISTORY_FIRST) {
        return Ok(rows.into_iter().map(|(v, _)| v).collect());
    }
    let found = rows.iter().map(|(v, _)| *v).max().unwrap_or(0);
    if found < OLD_HISTORY_LAST {
        return Err(Failure::Schema(SchemaTooOld { found }));
    }
    tx.execute("DELETE FROM wr_schema_migrations", &[]).await?;
    tx.execute(
        "INSERT INTO wr_schema_migrations (version, name) VALUES (1, $1)",
        &[&BASELINE],
    )
    .await?;
    Ok(vec![1])
}

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
    let applied = from_old_history(&tx).await?;
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
        for (_, sql) in FUNCTION_FILES {
            tx.batch_execute(sql).await?;
        }
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
    use super::{functions_checksum, FUNCTION_FILES, MIGRATIONS};

    #[test]
    fn the_migrations_define_no_function() {
        for m in MIGRATIONS {
            assert!(!m.sql.contains("CREATE FUNCTION"), "{}", m.name);
            assert!(!m.sql.contains("CREATE OR REPLACE FUNCTION"), "{}", m.name);
        }
    }

    #[test]
    fn versions_increase_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "{}", m.name);
        }
    }

    #[test]
    fn the_function_files_define_each_function_once_and_replaceably() {
        let mut names = Vec::new();
        for line in FUNCTION_FILES.iter().flat_map(|(_, sql)| sql.lines()) {
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
