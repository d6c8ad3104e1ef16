//! The PostgreSQL schema's old history (migrations 0001-0009 and the functions file, before the
//! baseline replaced them), read from git at the last revision that had it, for the tests of the
//! baseline and of the upgrade from the old history. Without git or that revision (a shallow
//! clone, the packaged crate) the tests say so in one line and pass; under `CI` they fail.

use std::path::Path;
use std::process::Command;

/// The last revision with the old history.
pub const REVISION: &str = "5f5eb62db86174c1d6a8f793b214243c1ce19e60";

/// The old migrations, oldest first: version, name (as `wr_schema_migrations` recorded it), file.
const OLD: &[(i32, &str, &str)] = &[
    (1, "schema", "0001_schema.sql"),
    (2, "functions", "0002_functions.sql"),
    (3, "lifecycle", "0003_lifecycle.sql"),
    (4, "retained_counter", "0004_retained_counter.sql"),
    (5, "lease_and_versions", "0005_lease_and_versions.sql"),
    (6, "identity", "0006_identity.sql"),
    (7, "event_log", "0007_event_log.sql"),
    (8, "waiting_room", "0008_waiting_room.sql"),
    (9, "payloads", "0009_payloads.sql"),
];

/// A file of the crate at [`REVISION`], or `None` (after saying why) when git cannot show it.
fn at_revision(path: &str) -> Option<String> {
    let out = Command::new("git")
        .args(["show", &format!("{REVISION}:{path}")])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8(o.stdout).expect("utf-8 SQL")),
        Ok(o) => skip(&format!(
            "the old migration history is not in this checkout ({}; a full clone has it)",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => skip(&format!("git cannot be run ({e})")),
    }
}

/// Says in one line why a test of the old history did not run; panics instead under `CI`.
fn skip(why: &str) -> Option<String> {
    if std::env::var_os("CI").is_some() {
        panic!("CI is set, and a test of the old schema history cannot run: {why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// The old history up to `last` (with the functions file of the time once it reached 0009, as
/// a connect then applied it), applied to the database of `client` as the old code did, each
/// migration recorded in `wr_schema_migrations`. `false` if the history cannot be read.
pub async fn migrate_old(client: &tokio_postgres::Client, last: i32) -> bool {
    client
        .batch_execute(
            "CREATE TABLE wr_schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await
        .unwrap();
    for &(version, name, file) in OLD.iter().filter(|m| m.0 <= last) {
        let Some(sql) = at_revision(&format!("src/postgres/migrations/{file}")) else {
            return false;
        };
        client
            .batch_execute(&format!("BEGIN;\n{sql}\n;COMMIT;"))
            .await
            .unwrap_or_else(|e| panic!("old migration {file}: {e}"));
        client
            .execute(
                "INSERT INTO wr_schema_migrations (version, name) VALUES ($1, $2)",
                &[&version, &name],
            )
            .await
            .unwrap();
    }
    if last == 9 {
        let Some(sql) = at_revision("src/postgres/functions.sql") else {
            return false;
        };
        client.batch_execute(&sql).await.unwrap();
    }
    true
}

/// The schema of the database at `url` as `pg_dump --schema-only` writes it, without functions
/// and without the two tables `migrate.rs` keeps its own records in (`wr_schema_migrations`,
/// `wr_functions`): its entries (one per object, from its `-- Name:` header), sorted, so that
/// the order pg_dump picks from the objects' dependencies does not count. `None` (said) without
/// `pg_dump`.
pub fn schema_without_functions(url: &str) -> Option<Vec<String>> {
    let Some(pg_dump) = super::pg_cluster::tool("pg_dump") else {
        skip("no pg_dump beside initdb (install postgresql's client programs)");
        return None;
    };
    let out = Command::new(pg_dump)
        .args(["--schema-only", "--no-owner", "--dbname", url])
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut entries: Vec<String> = text
        .split("\n--\n-- Name: ")
        .skip(1)
        .filter(|e| {
            let head = e.lines().next().unwrap_or("");
            !head.contains("; Type: FUNCTION;")
                && !head.starts_with("wr_schema_migrations")
                && !head.starts_with("wr_functions")
        })
        .map(|e| {
            // pg_dump 15.14+ brackets the dump with a random \restrict key.
            e.lines()
                .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_owned()
        })
        .collect();
    entries.sort();
    Some(entries)
}
