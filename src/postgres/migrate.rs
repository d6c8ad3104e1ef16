//! The embedded, versioned migrations: SQL files under `migrations/`, applied in order, each
//! once, recorded in `wr_schema_migrations`, all in one transaction under an advisory lock so
//! that replicas starting together apply them once.

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
];

/// The advisory lock (one bigint key: "wr-migr" in ASCII) that serialises migrations.
const MIGRATION_LOCK: i64 = 0x0077_722d_6d69_6772;

/// Applies the migrations the database does not have yet; returns their versions.
pub(crate) async fn apply(client: &mut Client) -> Result<Vec<i32>, Failure> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS wr_schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
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
    tx.commit().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    #[test]
    fn versions_increase_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "{}", m.name);
        }
    }
}
