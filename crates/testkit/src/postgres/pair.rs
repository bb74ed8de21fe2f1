//! A primary and its streaming standby ([`PgPair`]) on one port at two
//! loopback addresses (127.0.0.2 and 127.0.0.3 by default), for failover
//! tests: the standby is a `pg_basebackup -R` of the primary; `promote`
//! turns it into a primary, and `rewind_to_follow` brings a stopped old
//! primary back at its address as a standby of the new one (`pg_rewind -R`,
//! which needs the `wal_log_hints` and `full_page_writes` a pair turns on).
//! Server-side binaries run as `postgres` when we are root, as for any
//! [`PgServer`].

use super::*;

/// `pg_basebackup` and `pg_rewind` copy a whole cluster.
const COPY_TIMEOUT: Duration = Duration::from_secs(120);

/// A primary and its standby, streaming. Both stop and are deleted on drop.
#[derive(Debug)]
pub struct PgPair {
    /// Started as the primary (at the first address).
    pub first: PgServer,
    /// Started as its standby (at the second address).
    pub second: PgServer,
}

impl PgPair {
    /// A primary at 127.0.0.2 and its standby at 127.0.0.3, one port.
    pub fn start(opts: PgOptions) -> Result<PgPair, TestkitError> {
        Self::start_at("127.0.0.2", "127.0.0.3", opts)
    }

    /// A primary at `first` and its standby at `second` (loopback
    /// addresses), on one port free on both; returns once the standby
    /// streams from the primary.
    pub fn start_at(first: &str, second: &str, opts: PgOptions) -> Result<PgPair, TestkitError> {
        let mut opts = opts;
        opts.extra_conf.extend([
            ("wal_log_hints".to_owned(), "on".to_owned()),
            ("full_page_writes".to_owned(), "on".to_owned()),
            ("wal_keep_size".to_owned(), "'64MB'".to_owned()),
        ]);
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_on(&[first, second])?;
            let primary = match PgServer::start_on(first, Some(port), opts.clone()) {
                Ok(p) => p,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match PgServer::standby_of(&primary, second, &opts) {
                Ok(standby) => {
                    let pair = PgPair { first: primary, second: standby };
                    pair.second.wait_streaming()?;
                    return Ok(pair);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| TestkitError::NoPostgres("no pair started".into())))
    }
}

/// A port free on every one of `hosts` a moment ago.
fn free_on(hosts: &[&str]) -> Result<u16, TestkitError> {
    for _ in 0..50 {
        let port = crate::try_free_port().map_err(|e| TestkitError::io("finding a free port", e))?;
        if hosts.iter().all(|h| std::net::TcpListener::bind((*h, port)).is_ok()) {
            return Ok(port);
        }
    }
    Err(TestkitError::io("finding a port free on every address", std::io::Error::other("none found")))
}

impl PgServer {
    /// A streaming standby of `primary` at `host` (same port): a
    /// `pg_basebackup -R` of it, started.
    fn standby_of(primary: &PgServer, host: &str, opts: &PgOptions) -> Result<PgServer, TestkitError> {
        let mut srv = PgServer::unstarted(host)?;
        srv.port = primary.port;
        let port = primary.port.to_string();
        let cmd = srv.server_cmd(
            "pg_basebackup",
            &[
                OsStr::new("-h"),
                OsStr::new(primary.host()),
                OsStr::new("-p"),
                OsStr::new(&port),
                OsStr::new("-U"),
                OsStr::new(SUPERUSER),
                OsStr::new("-D"),
                srv.data_dir.as_os_str(),
                OsStr::new("-R"),
                OsStr::new("--no-sync"),
                OsStr::new("-c"),
                OsStr::new("fast"),
            ],
        );
        run(cmd, COPY_TIMEOUT)?;
        srv.own_settings(opts)?;
        srv.pg_ctl_start()?;
        Ok(srv)
    }

    /// Appends this server's own address, port and socket folder to a
    /// copied cluster's postgresql.conf (later lines win).
    fn own_settings(&self, opts: &PgOptions) -> Result<(), TestkitError> {
        let path = self.data_dir.join("postgresql.conf");
        let mut conf =
            std::fs::read_to_string(&path).map_err(|e| TestkitError::io(format!("reading {}", path.display()), e))?;
        conf.push('\n');
        conf.push_str(&self.conf_block(opts));
        std::fs::write(&path, conf).map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
    }

    /// Waits until this standby streams from its primary.
    fn wait_streaming(&self) -> Result<(), TestkitError> {
        let until = Instant::now() + PG_CTL_TIMEOUT;
        loop {
            let status = self.psql("postgres", "select status from pg_stat_wal_receiver");
            if status.as_deref().is_ok_and(|s| s == "streaming") {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(TestkitError::StartFailed {
                    attempts: 1,
                    reason: format!("the standby at {} never streamed: {status:?}", self.host),
                    log_tail: tail(&read_lossy(&self.log_file()), 40),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `pg_ctl promote -w`: a standby becomes a primary.
    pub fn promote(&self) -> Result<(), TestkitError> {
        self.pg_ctl(&["promote"])
    }

    /// True while the server is in recovery (a standby).
    pub fn in_recovery(&self) -> Result<bool, TestkitError> {
        Ok(self.psql("postgres", "select pg_is_in_recovery()")? == "t")
    }

    /// Brings this stopped old primary back at its address as a standby of
    /// `primary` (the promoted one): `pg_rewind -R` from it, then a start.
    pub fn rewind_to_follow(&self, primary: &PgServer) -> Result<(), TestkitError> {
        let source = format!("host={} port={} user={SUPERUSER} dbname=postgres", primary.host(), primary.port());
        let cmd = self.server_cmd(
            "pg_rewind",
            &[
                OsStr::new("-D"),
                self.data_dir.as_os_str(),
                OsStr::new("--source-server"),
                OsStr::new(&source),
                OsStr::new("-R"),
                OsStr::new("--no-sync"),
            ],
        );
        run(cmd, COPY_TIMEOUT)?;
        self.pg_ctl_start()?;
        self.wait_streaming()
    }

    /// Restarts this server with `default_transaction_read_only = on`: not
    /// in recovery, but refusing writes by default.
    pub fn restart_read_only(&self) -> Result<(), TestkitError> {
        self.set_read_only(true)?;
        self.pg_ctl_start()
    }

    /// Writes `default_transaction_read_only` into postgresql.conf (read at
    /// the next start or reload).
    fn set_read_only(&self, on: bool) -> Result<(), TestkitError> {
        let path = self.data_dir.join("postgresql.conf");
        let mut conf =
            std::fs::read_to_string(&path).map_err(|e| TestkitError::io(format!("reading {}", path.display()), e))?;
        let _ = writeln!(conf, "default_transaction_read_only = {}", if on { "on" } else { "off" });
        std::fs::write(&path, conf).map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_streams_fails_over_and_the_old_primary_follows() {
        let pair = PgPair::start(PgOptions { log_connections: false, ..PgOptions::default() }).expect("a pair");
        assert_eq!((pair.first.host(), pair.second.host()), ("127.0.0.2", "127.0.0.3"));
        assert_eq!(pair.first.port(), pair.second.port());
        assert!(!pair.first.in_recovery().unwrap() && pair.second.in_recovery().unwrap());
        pair.first.psql(APP_DB, "create table t(x int); insert into t values (1)").unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while pair.second.psql(APP_DB, "select count(*) from t").ok().as_deref() != Some("1") {
            assert!(Instant::now() < until, "the row never reached the standby");
            std::thread::sleep(Duration::from_millis(50));
        }
        pair.first.stop().unwrap();
        pair.second.promote().unwrap();
        assert!(!pair.second.in_recovery().unwrap());
        pair.second.psql(APP_DB, "insert into t values (2)").unwrap();
        pair.first.rewind_to_follow(&pair.second).expect("the old primary follows the new one");
        assert!(pair.first.in_recovery().unwrap());
        let until = Instant::now() + Duration::from_secs(30);
        while pair.first.psql(APP_DB, "select count(*) from t").ok().as_deref() != Some("2") {
            assert!(Instant::now() < until, "the new row never reached the old primary");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
