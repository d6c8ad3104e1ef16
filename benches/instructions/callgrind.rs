//! Running one row under callgrind and reading its instruction count.

use std::path::Path;
use std::process::Command;

/// Whether `valgrind` can be run.
pub fn available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs this executable as `--row <name>` under callgrind, counting only inside `measured`, and
/// returns the instructions executed there (`Ir`).
pub fn count(exe: &Path, row: &str, out_dir: &Path) -> Result<u64, String> {
    let out = out_dir.join(format!("callgrind.{row}.out"));
    let run = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=*measured*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(["--row", row])
        .output()
        .map_err(|e| format!("cannot run valgrind: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "{row}: valgrind exited with {}:\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    total(&text).ok_or_else(|| format!("{}: no `totals:` or `summary:` line", out.display()))
}

/// The `totals:` (or `summary:`) figure of a callgrind output file: its first event, `Ir`.
pub fn total(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.starts_with("totals:"))
        .or_else(|| text.lines().find(|l| l.starts_with("summary:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
