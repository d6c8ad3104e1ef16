//! The Lua scripts, one per operation, each the shared prelude (`scripts/lib.lua`) followed by the
//! operation's file. Built once per process; redis-rs sends them by SHA (`EVALSHA`) and loads
//! them when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

const LIB: &str = include_str!("scripts/lib.lua");

macro_rules! scripts {
    ($($name:ident => $file:literal),* $(,)?) => {
        /// Every script the backend runs.
        pub(crate) struct Scripts {
            $(pub(crate) $name: Script,)*
        }

        /// The scripts, built on first use.
        pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $($name: Script::new(&format!("{LIB}\n{}", include_str!(concat!("scripts/", $file)))),)*
        });

        /// Each script's name and full source (for tests that check them).
        #[cfg(test)]
        pub(crate) fn sources() -> Vec<(&'static str, String)> {
            vec![$((stringify!($name), format!("{LIB}\n{}", include_str!(concat!("scripts/", $file)))),)*]
        }
    };
}

scripts! {
    admit => "admit.lua",
    assign => "assign.lua",
    claim => "claim.lua",
    release => "release.lua",
    complete => "complete.lua",
    heartbeat => "heartbeat.lua",
    loop_started => "loop_started.lua",
    loop_finished => "loop_finished.lua",
    register => "register.lua",
    deregister => "deregister.lua",
    drain => "drain.lua",
    worker => "worker.lua",
    sweep => "sweep.lua",
    acknowledge => "acknowledge.lua",
    snapshot => "snapshot.lua",
    listen => "listen.lua",
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_reads_the_clock_through_the_prelude_and_names_no_key_of_its_own() {
        for (name, src) in super::sources() {
            let body = &src[super::LIB.len()..];
            // Keys come from the prefix helpers (one hash tag); time from `clock()`.
            assert!(!body.contains("KEYS["), "{name} uses KEYS directly");
            assert!(!body.contains("'TIME'"), "{name} reads TIME itself");
        }
    }
}
