//! A worker's output in the router's log: its bytes cut into lines, each logged through
//! `tracing` tagged with the worker id and the stream (`worker = 7, stream = "stdout"`), under the
//! target [`OUTPUT_TARGET`] (so `RUST_LOG=webhook_router::worker_output=warn` silences workers
//! without silencing the router). Shared by the `process` and `docker` launchers.
//!
//! A line is at most [`MAX_LINE`] bytes: a longer one is logged in pieces (each says it is
//! `partial`), so a worker that prints without newlines cannot grow the router's memory. Bytes
//! that are not UTF-8 are logged replaced (`U+FFFD`), never dropped with their line.

use worker_registry::WorkerId;

/// The `tracing` target of workers' output lines.
pub const OUTPUT_TARGET: &str = "webhook_router::worker_output";

/// The longest line logged whole, in bytes; a longer one is logged in pieces of this size.
pub const MAX_LINE: usize = 16 * 1024;

/// Cuts one stream of one worker into lines and logs each (see the [module documentation](self)).
#[derive(Debug)]
pub struct Lines {
    worker: WorkerId,
    stream: &'static str,
    pending: Vec<u8>,
}

impl Lines {
    /// Lines of `worker`'s `stream` (`"stdout"`, `"stderr"`).
    pub fn new(worker: WorkerId, stream: &'static str) -> Self {
        Self {
            worker,
            stream,
            pending: Vec::new(),
        }
    }

    /// Logs every complete line in `pending` followed by `bytes`, and keeps the rest.
    pub fn push(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(end);
            self.pending.extend_from_slice(line);
            self.flush_pieces();
            let whole = std::mem::take(&mut self.pending);
            self.log(&whole, false);
            bytes = &rest[1..];
        }
        self.pending.extend_from_slice(bytes);
        self.flush_pieces();
    }

    /// Logs what is left (a last line with no newline): the stream has ended.
    pub fn finish(&mut self) {
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.log(&rest, false);
        }
    }

    /// Logs full pieces of an overlong line as partial.
    fn flush_pieces(&mut self) {
        while self.pending.len() > MAX_LINE {
            let rest = self.pending.split_off(MAX_LINE);
            let piece = std::mem::replace(&mut self.pending, rest);
            self.log(&piece, true);
        }
    }

    fn log(&self, line: &[u8], partial: bool) {
        let line = String::from_utf8_lossy(line);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        tracing::info!(target: OUTPUT_TARGET, worker = %self.worker, stream = self.stream, partial, "{line}");
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        self.finish();
    }
}
