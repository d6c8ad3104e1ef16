//! The Lua decisions as one Redis Function library (Redis 7: `FUNCTION LOAD`, `FCALL`): the shared
//! part (`scripts/lib_base.lua`, `lib_claims.lua`, `lib_workers.lua`) runs once when the library
//! is loaded and defines the helpers as library-level locals; each decision's own file (one per
//! decision, as before) becomes the body of one `redis.register_function`, flagged `no-writes`
//! where it only reads. A call runs only `begin` (the prefix's cached key table) and its own work,
//! not a prelude of table and closure set-up.
//!
//! **Versioning.** The library's name is `wr_<checksum>` (FNV-1a 64 of the assembled source,
//! 16 hex digits) and every function's name starts with it (`wr_<checksum>_admit`), so two
//! builds of the library coexist on one server (a rolling upgrade: each router calls its own
//! version; nothing is replaced under a running one). [`RedisRegistry::connect`] loads the
//! library unless the server has it (`FUNCTION LIST LIBRARYNAME`), and a call the server answers
//! "Function not found" (a new server without persistence, `FUNCTION FLUSH`) loads it
//! (`FUNCTION LOAD REPLACE`) and is sent once more. `FLUSHALL` keeps functions.
//!
//! [`RedisRegistry::connect`]: super::RedisRegistryBuilder::connect

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, RedisWrite, ToRedisArgs};

/// Helpers every decision may use: key names, the clock, events (`begin`, `clock`, `emit`, ...).
const BASE: &str = include_str!("scripts/lib_base.lua");
/// Claim standing and removal.
const CLAIMS: &str = include_str!("scripts/lib_claims.lua");
/// Worker placement, death bookkeeping and encoding.
const WORKERS: &str = include_str!("scripts/lib_workers.lua");
/// The waiting room: parking, promotion, a death's hook.
const WAITING: &str = include_str!("scripts/lib_waiting.lua");

/// One function of the library, by its full name (`wr_<checksum>_<decision>`).
pub(crate) struct Function {
    name: String,
}

impl Function {
    /// A call of this function with its one key (the registry's offset key); arguments follow.
    pub(crate) fn key<K: ToRedisArgs>(&self, key: K) -> Call {
        // Room for a typical call (FCALL, the name, 1, the key, the prefix, the replica id and
        // about eight arguments), so that building it does not grow the buffers step by step.
        let mut cmd = Cmd::with_capacity(16, 256);
        cmd.arg("FCALL").arg(&self.name).arg(1).arg(key);
        Call { cmd }
    }

    /// The function's full name.
    #[cfg(test)]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// One `FCALL` being built.
pub(crate) struct Call {
    cmd: Cmd,
}

impl Call {
    /// Appends an argument (ARGV).
    pub(crate) fn arg<A: ToRedisArgs>(&mut self, arg: A) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Appends `value` as text, formatted straight into the command's buffer (no `String` per
    /// argument, as `arg(value.to_string())` would make).
    pub(crate) fn text(&mut self, value: impl std::fmt::Display) -> &mut Self {
        self.cmd.write_arg_fmt(value);
        self
    }

    /// Appends a named argument: `name`, then `value` (a function that takes its arguments by
    /// name reads them into a table; see `scripts/sweep.lua`).
    pub(crate) fn named<A: ToRedisArgs>(&mut self, name: &str, value: A) -> &mut Self {
        self.cmd.arg(name).arg(value);
        self
    }

    /// Sends the call; if the server has no such function (a new server, `FUNCTION FLUSH`), loads
    /// the library and sends it once more.
    pub(crate) async fn invoke_async<T: FromRedisValue, C: ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if function_missing(&e) => {
                load(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

/// Sends `calls` as one pipeline (one round trip, each call its own atomic step); if the server
/// has no such function, loads the library and sends them once more.
pub(crate) async fn invoke_all<T: FromRedisValue, C: ConnectionLike>(
    calls: &[Call],
    conn: &mut C,
) -> RedisResult<Vec<T>> {
    let mut pipe = redis::pipe();
    for call in calls {
        pipe.add_command(call.cmd.clone());
    }
    match pipe.query_async(conn).await {
        Err(e) if function_missing(&e) => {
            load(conn).await?;
            pipe.query_async(conn).await
        }
        answer => answer,
    }
}

/// Whether the server answered that the function (or its library) is not loaded.
fn function_missing(e: &RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// Loads (or replaces) the library on the server.
pub(crate) async fn load<C: ConnectionLike>(conn: &mut C) -> RedisResult<()> {
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.source)
        .query_async(conn)
        .await?;
    Ok(())
}

/// Loads the library unless the server has this version of it already.
pub(crate) async fn ensure_loaded<C: ConnectionLike>(conn: &mut C) -> RedisResult<()> {
    let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&LIBRARY.name)
        .query_async(conn)
        .await?;
    if listed.is_empty() {
        load(conn).await?;
    }
    Ok(())
}

/// FNV-1a, 64 bits: a checksum stable across builds and processes (the library's version).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The assembled library: its name and its source.
pub(crate) struct Library {
    pub(crate) name: String,
    pub(crate) source: String,
}

/// Assembles the library from the shared files and `(decision, body, read_only)` triples.
fn assemble(decisions: &[(&str, &str, bool)]) -> Library {
    let mut body = String::new();
    for part in [BASE, CLAIMS, WORKERS, WAITING] {
        body.push_str(part);
        body.push('\n');
    }
    for (decision, code, read_only) in decisions {
        let flags = if *read_only { "{ 'no-writes' }" } else { "{}" };
        body.push_str(&format!(
            "redis.register_function{{ function_name = NS .. '_{decision}', flags = {flags}, \
             callback = function(KEYS, ARGV) begin(KEYS, ARGV)\n{code}\nend }}\n"
        ));
    }
    let name = format!("wr_{:016x}", fnv1a(&body));
    let source = format!("#!lua name={name}\nlocal NS = '{name}'\n{body}");
    Library { name, source }
}

macro_rules! scripts {
    ($($name:ident => $file:literal $(, $ro:ident)?;)*) => {
        /// Every function the backend calls.
        pub(crate) struct Functions {
            $(pub(crate) $name: Function,)*
        }

        /// Each decision: its name, its own file, and whether it only reads.
        const DECISIONS: &[(&str, &str, bool)] = &[$((
            stringify!($name),
            include_str!(concat!("scripts/", $file)),
            scripts!(@ro $($ro)?),
        ),)*];

        /// The library, assembled on first use.
        pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| assemble(DECISIONS));

        /// The functions, named on first use.
        pub(crate) static SCRIPTS: LazyLock<Functions> = LazyLock::new(|| Functions {
            $($name: Function { name: format!("{}_{}", LIBRARY.name, stringify!($name)) },)*
        });
    };
    (@ro read_only) => { true };
    (@ro) => { false };
}

scripts! {
    admit => "admit.lua";
    admit_waiting => "admit_waiting.lua";
    assign => "assign.lua";
    assign_waiting => "assign_waiting.lua";
    claim => "claim.lua";
    payload => "payload.lua", read_only;
    release => "release.lua";
    complete => "complete.lua";
    heartbeat => "heartbeat.lua";
    loop_started => "loop_started.lua";
    loop_finished => "loop_finished.lua";
    register => "register.lua";
    deregister => "deregister.lua";
    drain => "drain.lua";
    worker => "worker.lua", read_only;
    audit => "audit.lua", read_only;
    sweep => "sweep.lua";
    acknowledge => "acknowledge.lua";
    expire_released => "expire_released.lua";
    waiting => "waiting.lua";
    publish => "publish.lua";
    changes => "changes.lua", read_only;
    snap_page => "snap_page.lua", read_only;
    listen => "listen.lua";
    identity => "identity.lua";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_reads_the_clock_through_the_helpers_and_names_no_key_of_its_own() {
        for (name, body, _) in DECISIONS {
            // Keys come from the prefix (one hash tag); time from `clock()`.
            assert!(!body.contains("KEYS["), "{name} uses KEYS directly");
            assert!(!body.contains("'TIME'"), "{name} reads TIME itself");
        }
        for lib in [CLAIMS, WORKERS, WAITING] {
            assert!(!lib.contains("KEYS["), "a helper uses KEYS directly");
            assert!(!lib.contains("'TIME'"), "a helper reads TIME itself");
        }
    }

    #[test]
    fn read_only_decisions_make_no_write_and_the_shared_part_makes_no_call_at_load() {
        let writes = [
            "'SET'", "'HSET'", "'DEL'", "'ZADD'", "'ZREM'", "'HDEL'", "'XADD'", "'INCR'",
        ];
        for (name, body, read_only) in DECISIONS {
            if *read_only {
                for w in writes {
                    assert!(!body.contains(w), "{name} is read-only but calls {w}");
                }
            }
        }
        // A library's top level runs at FUNCTION LOAD, where redis.call is refused: every call in
        // the shared files is inside a function (indented).
        for lib in [BASE, CLAIMS, WORKERS, WAITING] {
            for line in lib.lines() {
                assert!(
                    !line.starts_with("redis.call") && !line.starts_with("local x = redis"),
                    "a top-level call at load: {line}"
                );
            }
        }
    }

    #[test]
    fn the_library_is_named_by_its_checksum_and_names_every_function_after_it() {
        let lib = &*LIBRARY;
        assert!(lib
            .source
            .starts_with(&format!("#!lua name={}\n", lib.name)));
        assert_eq!(lib.name.len(), "wr_".len() + 16);
        assert_eq!(
            SCRIPTS.admit.name(),
            format!("{}_admit", lib.name),
            "functions carry the version"
        );
        let n = lib.source.matches("redis.register_function{").count();
        assert_eq!(n, DECISIONS.len());
        // Another body is another version.
        let other = assemble(&[("admit", "return 1", false)]);
        assert_ne!(other.name, lib.name);
        assert_eq!(assemble(DECISIONS).name, lib.name, "stable");
    }

    /// The server's clock in ms.
    async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
        secs * 1000 + micros / 1000
    }

    /// Sets worker 7 under `prefix` running, last beat `stored`, and out of the beat index (so
    /// that the beat takes the path that reads its hash); heartbeats it (no offset key: KEYS[1]
    /// is the bare prefix, as in a build without `testkit`); answers its stored beat.
    async fn beat(
        conn: &mut redis::aio::MultiplexedConnection,
        prefix: &str,
        stored: &str,
    ) -> String {
        let worker = format!("{prefix}w:7");
        let _: () = redis::cmd("HSET")
            .arg(&worker)
            .arg(&["s", "0", "hb", stored, "r", "0", "bt", "1"])
            .query_async(conn)
            .await
            .expect("HSET");
        let _: () = redis::cmd("DEL")
            .arg(format!("{prefix}beat"))
            .query_async(conn)
            .await
            .expect("DEL");
        let reply: String = SCRIPTS
            .heartbeat
            .key(prefix)
            .arg(prefix)
            .arg("replica")
            .arg(7)
            .arg(30_000)
            .invoke_async(conn)
            .await
            .expect("heartbeat");
        assert_eq!(reply, "outcome\tactive");
        redis::cmd("HGET")
            .arg(&worker)
            .arg("hb")
            .query_async(conn)
            .await
            .expect("HGET")
    }

    /// The heartbeat's text clock and comparison (`clock_text`, `later_text` in lib_base.lua)
    /// on a real server, without the test offset key: the suite's registries (feature
    /// `testkit`) always pass it, so the suite reaches only the numeric clock.
    #[tokio::test]
    async fn a_heartbeat_without_an_offset_stores_the_later_of_now_and_its_beat_as_integer_text() {
        let Some(url) = test_servers::redis::shared("scripts") else {
            return;
        };
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        load(&mut conn).await.expect("load");
        let prefix = format!("{{{}}}:", test_servers::redis::unique_name("text-clock"));
        for _ in 0..50 {
            // An earlier beat (shorter, then as long): the beat is now, as integer text.
            for stored in ["1000", "1000000000000"] {
                let before = server_ms(&mut conn).await;
                let hb = beat(&mut conn, &prefix, stored).await;
                let after = server_ms(&mut conn).await;
                let ms: u64 = hb.parse().expect("integer text");
                assert!(before <= ms && ms <= after, "{before} <= {hb} <= {after}");
                assert_eq!(hb, ms.to_string(), "no padding, no exponent");
            }
        }
        // A later beat (as long, then longer) stays.
        let later = (server_ms(&mut conn).await + 3_600_000).to_string();
        assert_eq!(beat(&mut conn, &prefix, &later).await, later);
        assert_eq!(
            beat(&mut conn, &prefix, "99999999999999").await,
            "99999999999999"
        );
    }

    /// The publisher's walk of the beat index (publish.lua) in pages of 64: 150 workers whose
    /// beats share one ms fill a page with one score (step 1 takes all 150), 40 share the next ms
    /// and 30 the one after (step 2's page ends inside those 30: it takes the 40 alone), then 10
    /// are spread out (step 3 takes the 30 and the 10, and is done). Every beat reaches `snap`,
    /// and the cursor ends at the last step's time.
    #[tokio::test]
    async fn the_publisher_takes_every_indexed_beat_even_when_a_page_ends_inside_one_ms() {
        let Some(url) = test_servers::redis::shared("scripts") else {
            return;
        };
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        load(&mut conn).await.expect("load");
        let prefix = format!("{{{}}}:", test_servers::redis::unique_name("beat-pages"));
        let start = server_ms(&mut conn).await;
        let base = start - 60_000;
        let mut beats = Vec::new();
        for id in 1..=230u64 {
            let score = match id {
                1..=150 => base,
                151..=190 => base + 1,
                191..=220 => base + 2,
                _ => base + 1_000 * (id - 220),
            }
            .min(start);
            beats.push((id, score));
            let _: () = redis::cmd("HSET")
                .arg(format!("{prefix}w:{id}"))
                .arg(&[
                    "s", "0", "b", "0", "x", "0", "bt", "1", "hb", "1000", "c", "1000",
                ])
                .arg(&["n", "0", "t", ""])
                .query_async(&mut conn)
                .await
                .expect("HSET");
            let _: () = redis::cmd("ZADD")
                .arg(format!("{prefix}beat"))
                .arg(score)
                .arg(id)
                .query_async(&mut conn)
                .await
                .expect("ZADD");
        }
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 20, "the walk ends");
            let reply: Vec<redis::Value> = SCRIPTS
                .publish
                .key(&prefix)
                .arg(&prefix)
                .arg("replica")
                .arg(start)
                .arg(0)
                .arg(0)
                .arg(0)
                .arg(64)
                .arg(8)
                .invoke_async(&mut conn)
                .await
                .expect("publish");
            if reply[1] == redis::Value::Int(1) {
                break;
            }
        }
        assert_eq!(steps, 3, "pages of 64");
        for (id, score) in beats {
            let line: String = redis::cmd("HGET")
                .arg(format!("{prefix}snap"))
                .arg(id)
                .query_async(&mut conn)
                .await
                .expect("HGET");
            let hb = line.split('\t').nth(7).expect("hb");
            assert_eq!(hb, score.to_string(), "worker {id}'s published beat");
        }
        let from: u64 = redis::cmd("GET")
            .arg(format!("{prefix}beat_from"))
            .query_async(&mut conn)
            .await
            .expect("GET");
        assert!(from >= start, "the cursor ends at the last step's time");
    }

    /// The source of `local function <name>` in lib_base.lua, through its closing `end`.
    fn base_function(name: &str) -> &'static str {
        let start = BASE
            .find(&format!("local function {name}("))
            .expect("defined");
        let len = BASE[start..].find("\nend\n").expect("closed") + "\nend\n".len();
        &BASE[start..start + len]
    }

    /// `ms_text` and `later_text` (lib_base.lua) against the arithmetic they stand for, run from
    /// the library's own text on a real server: every padding of TIME's microseconds, and
    /// comparisons of as long and of longer texts.
    #[tokio::test]
    async fn the_text_clock_is_the_integer_clock_and_text_times_compare_as_numbers() {
        let Some(url) = test_servers::redis::shared("scripts") else {
            return;
        };
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let script = format!(
            "{}{}return {{ ms_text(ARGV[1], ARGV[2]), later_text(ARGV[3], ARGV[4]) }}",
            base_function("ms_text"),
            base_function("later_text")
        );
        let secs: u64 = 1_796_192_650;
        for us in [0u64, 7, 999, 1000, 5231, 99_999, 100_000, 123_456, 999_999] {
            for (a, b) in [
                (1000u64, 999),
                (999, 1000),
                (1_796_192_650_873, 1_796_192_650_874),
            ]
            .into_iter()
            .chain([(7, 7), (10_000_000_000_000, 9_999_999_999_999)])
            {
                let (ms, later): (String, String) = redis::cmd("EVAL")
                    .arg(&script)
                    .arg(0)
                    .arg(secs)
                    .arg(us)
                    .arg(a)
                    .arg(b)
                    .query_async(&mut conn)
                    .await
                    .expect("EVAL");
                assert_eq!(ms, (secs * 1000 + us / 1000).to_string(), "us {us}");
                assert_eq!(later, a.max(b).to_string(), "{a} vs {b}");
            }
        }
    }

    /// `succ_text` (lib_base.lua, the sticky placement's assignment count) against `n + 1`, run
    /// from the library's own text on a real server: no count, every carry, and a longer result.
    #[tokio::test]
    async fn the_text_successor_is_the_integer_successor() {
        let Some(url) = test_servers::redis::shared("scripts") else {
            return;
        };
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let script = format!(
            "{}return {{ succ_text(ARGV[1]), succ_text(nil) }}",
            base_function("succ_text")
        );
        for n in [
            0u64,
            1,
            8,
            9,
            10,
            19,
            99,
            109,
            199,
            999,
            1_048_574,
            1_048_575,
            9_999_999_999,
        ] {
            let (succ, none): (String, String) = redis::cmd("EVAL")
                .arg(&script)
                .arg(0)
                .arg(n)
                .query_async(&mut conn)
                .await
                .expect("EVAL");
            assert_eq!(succ, (n + 1).to_string(), "{n}");
            assert_eq!(none, "1", "no count yet");
        }
        let (empty, _): (String, String) = redis::cmd("EVAL")
            .arg(&script)
            .arg(0)
            .arg("")
            .query_async(&mut conn)
            .await
            .expect("EVAL");
        assert_eq!(empty, "1", "an empty count is 0");
    }
}
