//! The Lua scripts, one per operation: the shared prelude (`scripts/lib_base.lua`), the helpers the
//! operation uses (`lib_claims.lua`, `lib_workers.lua`), then the operation's own file. Built once per process; redis-rs sends them by SHA (`EVALSHA`) and loads
//! them when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// The prelude of every script: key names, the clock, events.
const BASE: &str = include_str!("scripts/lib_base.lua");
/// Claim standing and removal.
const CLAIMS: &str = include_str!("scripts/lib_claims.lua");
/// Worker placement, death bookkeeping and encoding.
const WORKERS: &str = include_str!("scripts/lib_workers.lua");

/// A script's source: the prelude, the helpers it uses, its own file.
fn source(parts: &[&str], body: &str) -> String {
    let mut s = String::from(BASE);
    for p in parts {
        s.push('\n');
        s.push_str(p);
    }
    s.push('\n');
    s.push_str(body);
    s
}

macro_rules! scripts {
    ($($name:ident => $file:literal [$($part:ident),*]),* $(,)?) => {
        /// Every script the backend runs.
        pub(crate) struct Scripts {
            $(pub(crate) $name: Script,)*
        }

        /// The scripts, built on first use.
        pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $($name: Script::new(&source(&[$($part),*], include_str!(concat!("scripts/", $file)))),)*
        });

        /// Each script's name, own file and full source (for tests that check them).
        #[cfg(test)]
        pub(crate) fn sources() -> Vec<(&'static str, &'static str, String)> {
            vec![$((
                stringify!($name),
                include_str!(concat!("scripts/", $file)),
                source(&[$($part),*], include_str!(concat!("scripts/", $file))),
            ),)*]
        }
    };
}

// Each script includes only the helpers it calls: the whole chunk runs on every call, and the
// hot ones (heartbeat, a duplicate admit) are a few commands long.
scripts! {
    admit => "admit.lua" [CLAIMS, WORKERS],
    assign => "assign.lua" [WORKERS],
    claim => "claim.lua" [CLAIMS],
    release => "release.lua" [CLAIMS],
    complete => "complete.lua" [CLAIMS],
    heartbeat => "heartbeat.lua" [],
    loop_started => "loop_started.lua" [],
    loop_finished => "loop_finished.lua" [WORKERS],
    register => "register.lua" [],
    deregister => "deregister.lua" [WORKERS],
    drain => "drain.lua" [WORKERS],
    worker => "worker.lua" [WORKERS],
    sweep => "sweep.lua" [CLAIMS, WORKERS],
    acknowledge => "acknowledge.lua" [],
    publish => "publish.lua" [WORKERS],
    changes => "changes.lua" [],
    snap_page => "snap_page.lua" [],
    listen => "listen.lua" [],
    identity => "identity.lua" [],
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_reads_the_clock_through_the_prelude_and_names_no_key_of_its_own() {
        for (name, body, _) in super::sources() {
            // Keys come from the prefix (one hash tag); time from `clock()`.
            assert!(!body.contains("KEYS["), "{name} uses KEYS directly");
            assert!(!body.contains("'TIME'"), "{name} reads TIME itself");
        }
    }

    /// The names a helper file defines at its top level (`local function f`, `local A, B =`).
    fn defined(lib: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in lib.lines() {
            if let Some(rest) = line.strip_prefix("local function ") {
                names.extend(rest.split('(').next().map(str::to_owned));
            } else if let Some(rest) = line.strip_prefix("local ") {
                if let Some((lhs, _)) = rest.split_once(" =") {
                    names.extend(lhs.split(", ").map(str::to_owned));
                }
            }
        }
        names
    }

    fn uses(body: &str, name: &str) -> bool {
        body.match_indices(name).any(|(i, _)| {
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
            !body[..i].ends_with(word) && !body[i + name.len()..].starts_with(word)
        })
    }

    #[test]
    fn every_helper_a_script_uses_is_included() {
        for lib in [super::CLAIMS, super::WORKERS] {
            let names = defined(lib);
            assert!(names.len() >= 2, "{names:?}");
            for (name, body, full) in super::sources() {
                for n in &names {
                    if uses(body, n) {
                        assert!(full.contains(lib), "{name} uses {n} without its helpers");
                    }
                }
            }
        }
    }
}
