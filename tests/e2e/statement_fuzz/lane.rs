//! A lane: where cases run one after another while other lanes run theirs.
//! Each lane has a database of its own in the one Postgres (its tables, its
//! locks), a superuser connection that puts the tables back before a run
//! wherever one before it may have changed them, and a fresh weir for
//! every run through weir, so that a case's outcome depends on the case
//! alone: the same in any lane, after any other case, or alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_postgres::Client;
use weir::{Config, Weir};
use weir_e2e::{connect, PgServer, APP_DB};

use super::case::{smaller, valid, Case};
use super::client::{run, Msg, Target};

/// Clients per case, and the pool they share through weir.
pub const CLIENTS: usize = 3;

/// Re-runs a shrink may spend.
const SHRINK_BUDGET: usize = 80;

/// The tables a run starts with. `fz` and `sb.fz` (a `text` column where
/// `fz` has an `int`: a statement planned under the other search_path
/// shows) belong to the clients' user, so that their DDL runs.
const TABLES: &str = "grant all on schema public to public; \
    create table fz (a int); alter table fz owner to trust_user; \
    create schema sb; grant all on schema sb to public; \
    create table sb.fz (a text); alter table sb.fz owner to trust_user;";
const RESET: &str = "drop index if exists public.fz_i, sb.fz_i; truncate fz, sb.fz; \
    insert into fz values (1), (2), (3); insert into sb.fz values ('x'), ('y');";

/// Where a case runs: Postgres directly, or weir in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Direct,
    Session,
    Transaction,
    /// Transaction mode with unnamed statements served from weir's
    /// server-side ones from their first Parse (the default: the second).
    TransactionHot,
}

impl Mode {
    pub const THROUGH_WEIR: [Mode; 3] = [Mode::Session, Mode::Transaction, Mode::TransactionHot];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Session => "session",
            Mode::Transaction => "transaction",
            Mode::TransactionHot => "transaction, unnamed prepared at once",
        }
    }
}

/// How a case went.
pub enum Verdict {
    Same,
    /// Postgres itself did not answer it (a case the rules should not make).
    Unrunnable(String),
    /// weir differed in `Mode`: what differed.
    Differs(Mode, String),
}

pub struct Lane {
    pg: Arc<PgServer>,
    db: String,
    /// The superuser's connection to the lane's database (made again if
    /// Postgres ended it: a crash of one of its backends ends them all).
    admin: tokio::sync::Mutex<Client>,
    /// A run since the last reset may have changed the tables.
    dirty: AtomicBool,
}

impl Lane {
    /// Lane `n`: its database made afresh.
    pub async fn open(pg: Arc<PgServer>, n: usize) -> Lane {
        let db = format!("fz_{n}");
        let url = |db: &str| format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port());
        let root = connect(&url(APP_DB)).await.expect("connect to postgres");
        root.batch_execute(&format!("drop database if exists {db}")).await.expect("drop lane database");
        root.batch_execute(&format!("create database {db}")).await.expect("create lane database");
        let admin = connect(&url(&db)).await.expect("connect to lane database");
        admin.batch_execute(TABLES).await.expect("lane tables");
        Lane { pg, db, admin: tokio::sync::Mutex::new(admin), dirty: AtomicBool::new(true) }
    }

    /// Puts the tables back as `RESET` leaves them, unless no run since
    /// the last reset could have changed them; `writes`: the run to come
    /// may.
    async fn reset(&self, writes: bool) -> Result<(), String> {
        let mut admin = self.admin.lock().await;
        if !self.dirty.swap(writes, Ordering::Relaxed) {
            return Ok(());
        }
        if admin.is_closed() {
            let url = format!("postgres://postgres@127.0.0.1:{}/{}", self.pg.port(), self.db);
            *admin = connect(&url).await.map_err(|e| format!("reconnect: {e}"))?;
        }
        admin.batch_execute(RESET).await.map_err(|e| format!("reset: {e}"))
    }

    /// Runs `case` in `mode`, from the tables as `RESET` leaves them.
    pub async fn run(&self, case: &Case, mode: Mode) -> Result<Vec<Vec<Msg>>, String> {
        self.reset(case.writes()).await?;
        if mode == Mode::Direct {
            // The raw client names `app` first; the last `database` counts.
            let addr = format!("127.0.0.1:{}", self.pg.port()).parse().unwrap();
            return run(case, &Target { addr, startup: &[("database", &self.db)] }).await;
        }
        let weir = Weir::start(self.config(mode)).await.expect("start weir");
        let out = run(case, &Target { addr: weir.local_addr(), startup: &[] }).await;
        // Its clients have left outside any transaction block, so its
        // server connections hold no lock: it drains while the next run
        // starts.
        tokio::spawn(weir.shutdown());
        out
    }

    fn config(&self, mode: Mode) -> Config {
        let (pool_mode, after) = match mode {
            Mode::Session => ("session", 2),
            Mode::TransactionHot => ("transaction", 1),
            _ => ("transaction", 2),
        };
        // A small statement cache, so that statements are evicted and
        // prepared again.
        let text = format!(
            "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\npool_mode = \"{pool_mode}\"\n\
             default_pool_size = {CLIENTS}\nmax_prepared_statements = 3\nprepare_unnamed_after = {after}\n\
             [databases.app]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"{}\"\n",
            self.pg.port(),
            self.db
        );
        Config::from_toml(&text, &std::env::temp_dir()).expect("valid fuzz config")
    }

    /// Runs `case` directly, then through weir in each mode until one differs.
    pub async fn check(&self, case: &Case) -> Verdict {
        let want = match self.run(case, Mode::Direct).await {
            Ok(want) => want,
            Err(e) => return Verdict::Unrunnable(e),
        };
        for mode in Mode::THROUGH_WEIR {
            if let Some(diff) = self.differs(case, mode, &want).await {
                return Verdict::Differs(mode, diff);
            }
        }
        Verdict::Same
    }

    async fn differs(&self, case: &Case, mode: Mode, want: &[Vec<Msg>]) -> Option<String> {
        let got = match self.run(case, mode).await {
            Ok(got) => got,
            Err(e) => return Some(format!("{}: {e}", mode.name())),
        };
        for (c, (w, g)) in want.iter().zip(&got).enumerate() {
            let n = w.iter().zip(g).take_while(|(a, b)| a == b).count();
            if n < w.len() || n < g.len() {
                return Some(format!(
                    "client {c}, reply {n}: Postgres sent {:?}, weir ({}) sent {:?}\n  Postgres: {}\n  weir: {}",
                    w.get(n),
                    mode.name(),
                    g.get(n),
                    w.iter().map(|m| m.0).collect::<String>(),
                    g.iter().map(|m| m.0).collect::<String>(),
                ));
            }
        }
        None
    }

    /// Removes steps and ops while the case still differs in `mode`.
    pub async fn shrink(&self, mut case: Case, mode: Mode) -> (Case, Option<String>) {
        let mut budget = SHRINK_BUDGET;
        let mut last = None;
        'outer: while budget > 0 {
            for smaller in smaller(&case).into_iter().filter(valid) {
                if budget == 0 {
                    break 'outer;
                }
                budget -= 1;
                let Ok(want) = self.run(&smaller, Mode::Direct).await else { continue };
                if let Some(diff) = self.differs(&smaller, mode, &want).await {
                    case = smaller;
                    last = Some(diff);
                    continue 'outer;
                }
            }
            break;
        }
        (case, last)
    }
}
