//! The crate's error type, [`TestkitError`]: every failure of the throwaway
//! Postgres (missing binaries, failed commands with their stderr, timeouts,
//! start failures with a log tail) is reported through it.

use std::time::Duration;

/// Everything that can go wrong while managing a throwaway PostgreSQL (or a
/// PgBouncer beside it).
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// A PgBouncer started for comparison did not start or listen.
    #[error("pgbouncer {0}")]
    PgBouncer(String),

    /// No usable PostgreSQL installation was found.
    #[error("no PostgreSQL binaries found: {0}")]
    NoPostgres(String),

    /// An I/O operation (creating a directory, writing a config file, spawning a process) failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// An external command ran but exited unsuccessfully.
    #[error("command `{command}` failed ({status})\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}")]
    Command {
        /// The command line, for humans.
        command: String,
        /// The exit status, for humans.
        status: String,
        /// Captured standard output.
        stdout: String,
        /// Captured standard error.
        stderr: String,
    },

    /// An external command did not finish in time and was killed.
    #[error("command `{command}` timed out after {timeout:?} (killed)\n--- stderr so far ---\n{stderr}")]
    Timeout {
        /// The command line, for humans.
        command: String,
        /// How long we waited.
        timeout: Duration,
        /// Standard error captured before the kill.
        stderr: String,
    },

    /// The server could not be started.
    #[error("postgres failed to start after {attempts} attempt(s): {reason}\n--- log tail ---\n{log_tail}")]
    StartFailed {
        /// How many ports were tried.
        attempts: u32,
        /// The last error (usually a failed `pg_ctl start`).
        reason: String,
        /// The last lines of the server log.
        log_tail: String,
    },
}

impl TestkitError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TestkitError::Io { context: context.into(), source }
    }
}
