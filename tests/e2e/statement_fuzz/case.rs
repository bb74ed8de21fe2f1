//! The fuzzer's cases: what several clients send, as steps (one client's
//! messages at a time), generated from a seed under rules that keep the
//! outcome deterministic, written as a compact text (the regression cases
//! are kept in it), and encoded as wire messages.
//!
//! A step's text is `client:op;op;...`, steps joined by ` | `. Ops: `P<s>=<t>`
//! (Parse of statement `s` with text number `t`), `B<p>=<s>` (Bind of portal
//! `p` to statement `s`, `B<p>=<s>!` with a wrong parameter count), `DS<s>`,
//! `DP<p>`, `E<p>/<rows>`, `CS<s>`, `CP<p>`, `F` (Flush), `S` (Sync),
//! `Q<n>` (simple query number `n`). `_` is the unnamed statement or portal.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::protocol::tags::frontend as fe;
use weir_e2e::raw::tagged;

/// Statement texts, with their parameter counts. Number 6 fails to parse.
pub const TEXTS: &[(&str, usize)] = &[
    ("select 42 as x", 0),
    ("select $1::int + 1 as y", 1),
    ("select generate_series(1, 3) as g", 0),
    ("select a from fz order by a", 0),
    ("insert into fz values ($1::int)", 1),
    ("select 1 / (a - a) from fz", 0),
    ("select * from fz_missing", 0),
    ("select $1::int as i, $2::text as t", 2),
    ("", 0),
];

/// Simple queries. `DDL` are the ones that take locks other clients'
/// statements would wait for; `TX_*` open and close a transaction block.
pub const QUERIES: &[&str] = &[
    "begin",
    "commit",
    "rollback",
    "select 1",
    "insert into fz values (7)",
    "select count(*) from fz",
    "create index if not exists fz_i on fz (a)",
    "drop index if exists fz_i",
    "deallocate s1",
    "deallocate s3",
    "select 1/0",
    "select 42 as x",
    "set local search_path = sb, public",
];
const TX_BEGIN: usize = 0;
const TX_ENDS: [usize; 2] = [1, 2];
const DDL: [usize; 2] = [6, 7];
const INSERTS: [usize; 1] = [4];
/// Names resolve in `sb` first until the transaction block ends.
const SET_LOCAL_PATH: usize = 12;

const STATEMENTS: &[&str] = &["_", "s1", "s2", "s3", "s4"];
const PORTALS: &[&str] = &["_", "p1"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Parse { stmt: String, text: usize },
    Bind { portal: String, stmt: String, wrong: bool },
    DescribeS(String),
    DescribeP(String),
    Execute { portal: String, rows: i32 },
    CloseS(String),
    CloseP(String),
    Flush,
    Sync,
    Query(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub client: usize,
    pub ops: Vec<Op>,
}

impl Step {
    /// The client reads its replies after this step (it ends with a Sync, a
    /// Flush or a simple query); otherwise it goes on writing later.
    pub fn reads(&self) -> bool {
        matches!(self.ops.last(), Some(Op::Sync | Op::Flush | Op::Query(_)))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    pub clients: usize,
    pub steps: Vec<Step>,
}

/// The statement text that writes to a table.
const INSERT_TEXT: usize = 4;

impl Case {
    /// Whether a run of it may change the tables (an insert, an index made
    /// or dropped).
    pub fn writes(&self) -> bool {
        self.steps.iter().flat_map(|s| &s.ops).any(|op| match op {
            Op::Query(q) => DDL.contains(q) || INSERTS.contains(q),
            Op::Parse { text, .. } => *text == INSERT_TEXT,
            _ => false,
        })
    }
}

/// What the generator believes about one client.
#[derive(Default, Clone)]
struct Belief {
    /// Extended messages sent since the last Sync.
    open: bool,
    /// Unnamed statement and portals defined since the last Sync (or in
    /// the transaction block still open: its server stays the same).
    unnamed: bool,
    portals: Vec<String>,
    /// Named statements it parsed and did not close, as far as it knows.
    named: Vec<String>,
    /// A transaction block is open.
    in_tx: bool,
    /// What the rules track (`Rules`).
    rules: Rules,
}

/// What the rules that keep a case clear of differences by nature track of
/// one client: where its names resolve, as far as the case's text tells
/// (`SET LOCAL search_path` in a transaction block, until it ends), where
/// they resolved for each of its named Parses, and its unnamed portal.
///
/// A named statement is used (Bind, Describe) only where its names resolve
/// as they did when it was parsed. Used elsewhere, Postgres plans it again
/// under the new search_path and refuses a changed result type (0A000),
/// where weir, on a server that lacks the statement, prepares it under the
/// new search_path: its rows (or the types its Describe shows) are those of
/// the other table. That difference is inherent to sharing statements
/// across server connections, and the rules keep cases clear of it.
///
/// It also keeps the unnamed portal unused after a simple query in a
/// transaction block, until the block ends, but by the messages after a
/// Bind of it before the next Sync (the Bind replaces it, or fails and the
/// rest is skipped): a query that fails there leaves its unnamed portal
/// behind, failed, with its statements in memory Postgres has freed, and
/// an Execute of it can crash the backend (seen with 15.18: a segfault,
/// and every connection ended by the restart).
#[derive(Default, Clone)]
struct Rules {
    in_tx: bool,
    local: bool,
    parsed: Vec<(String, bool)>,
    query_in_block: bool,
    unnamed_bound: bool,
}

impl Rules {
    fn query(&mut self, q: usize) {
        self.unnamed_bound = false;
        if self.in_tx {
            self.query_in_block = true;
        }
        if q == TX_BEGIN {
            self.in_tx = true;
        }
        if q == SET_LOCAL_PATH && self.in_tx {
            self.local = true;
        }
        if TX_ENDS.contains(&q) {
            self.in_tx = false;
            self.local = false;
            self.query_in_block = false;
        }
    }

    fn bind(&mut self, portal: &str) {
        self.unnamed_bound |= portal == "_";
    }

    fn sync(&mut self) {
        self.unnamed_bound = false;
    }

    /// Whether the portal `p` may be used now.
    fn portal_usable(&self, p: &str) -> bool {
        p != "_" || !self.query_in_block || self.unnamed_bound
    }

    fn parse(&mut self, stmt: &str) {
        if stmt != "_" {
            self.parsed.push((stmt.to_owned(), self.local));
        }
    }

    /// Whether the named statement `stmt` may be used now.
    fn usable(&self, stmt: &str) -> bool {
        stmt == "_" || self.parsed.iter().all(|(n, local)| n != stmt || *local == self.local)
    }
}

/// The generator of case `n` of `seed`: each case is made from its own
/// seed, so that any one of them is made alone.
pub fn case_rng(seed: u64, n: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A random case: `clients` clients, up to `steps` steps.
pub fn generate(rng: &mut StdRng, clients: usize, steps: usize) -> Case {
    let mut b = vec![Belief::default(); clients];
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(steps / 2..=steps) {
        let c = rng.gen_range(0..clients);
        let quiet_others = b.iter().enumerate().all(|(i, x)| i == c || (!x.open && !x.in_tx));
        out.push(Step { client: c, ops: step_ops(rng, &mut b[c], quiet_others) });
    }
    // Every client ends synced and outside a transaction.
    for (c, x) in b.iter().enumerate() {
        let mut ops = vec![];
        if x.open {
            ops.push(Op::Sync);
        }
        out.push(Step { client: c, ops });
        if x.in_tx {
            out.push(Step { client: c, ops: vec![Op::Query(2)] });
        }
    }
    out.retain(|s| !s.ops.is_empty());
    Case { clients, steps: out }
}

/// One step: a simple query, or extended messages up to a Sync, a Flush
/// or neither; after a Sync, sometimes more of either in the same write
/// (a pipeline: what follows reaches the server before the Sync's outcome
/// reaches the client).
fn step_ops(rng: &mut StdRng, b: &mut Belief, quiet_others: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    loop {
        if !b.open && rng.gen_bool(0.25) {
            ops.push(Op::Query(query(rng, b, quiet_others)));
            if rng.gen_bool(0.8) {
                return ops;
            }
            continue;
        }
        for _ in 0..rng.gen_range(1..=7) {
            ops.push(extended_op(rng, b, quiet_others));
            b.open = true;
        }
        match rng.gen_range(0..10) {
            0..=5 => {
                ops.push(Op::Sync);
                b.rules.sync();
                b.open = false;
                if !b.in_tx {
                    b.unnamed = false;
                    b.portals.clear();
                }
                if rng.gen_bool(0.7) {
                    return ops;
                }
            }
            6..=8 => {
                ops.push(Op::Flush);
                return ops;
            }
            _ => return ops,
        }
    }
}

/// A simple query: transaction blocks begun and ended often, so that
/// statements meet failed and rolled back transactions.
fn query(rng: &mut StdRng, b: &mut Belief, quiet_others: bool) -> usize {
    let mut q = if !b.in_tx && rng.gen_bool(0.2) {
        TX_BEGIN
    } else if b.in_tx && rng.gen_bool(0.15) {
        TX_ENDS[rng.gen_range(0..TX_ENDS.len())]
    } else {
        rng.gen_range(0..QUERIES.len())
    };
    // DDL and inserts wait for locks: only when no one else holds any,
    // and never inside a transaction block (which would keep the lock).
    let locks = DDL.contains(&q) || INSERTS.contains(&q);
    if (DDL.contains(&q) && (b.in_tx || !quiet_others)) || (locks && !quiet_others) {
        q = 3;
    }
    // A simple query drops the unnamed statement.
    b.unnamed = false;
    if q == TX_BEGIN {
        b.in_tx = true;
    }
    if TX_ENDS.contains(&q) {
        b.in_tx = false;
        b.portals.clear();
    }
    b.rules.query(q);
    q
}

fn pick(rng: &mut StdRng, from: &[&str]) -> String {
    from[rng.gen_range(0..from.len())].to_owned()
}

fn extended_op(rng: &mut StdRng, b: &mut Belief, quiet_others: bool) -> Op {
    loop {
        let usable: Vec<String> = b.portals.iter().filter(|p| b.rules.portal_usable(p)).cloned().collect();
        let op = match rng.gen_range(0..12) {
            0..=2 => {
                let mut text = rng.gen_range(0..TEXTS.len());
                if text == INSERT_TEXT && !quiet_others {
                    text = 0;
                }
                let stmt = if rng.gen_bool(0.3) { "_".to_owned() } else { pick(rng, &STATEMENTS[1..]) };
                if stmt == "_" {
                    b.unnamed = true;
                } else if text != 6 && !b.named.contains(&stmt) {
                    b.named.push(stmt.clone());
                }
                b.rules.parse(&stmt);
                Op::Parse { stmt, text }
            }
            3..=5 => {
                let stmt = statement(rng, b, 0.5);
                if !b.rules.usable(&stmt) {
                    continue;
                }
                let portal = pick(rng, PORTALS);
                b.rules.bind(&portal);
                if !b.portals.contains(&portal) {
                    b.portals.push(portal.clone());
                }
                Op::Bind { portal, stmt, wrong: rng.gen_bool(0.05) }
            }
            6 => {
                let s = statement(rng, b, 0.3);
                if !b.rules.usable(&s) {
                    continue;
                }
                Op::DescribeS(s)
            }
            7 if !usable.is_empty() => Op::DescribeP(usable[rng.gen_range(0..usable.len())].clone()),
            8 | 9 if !usable.is_empty() => Op::Execute {
                portal: usable[rng.gen_range(0..usable.len())].clone(),
                rows: [0, 0, 1, 2][rng.gen_range(0..4)],
            },
            10 => {
                let s = pick(rng, &STATEMENTS[1..]);
                b.named.retain(|n| *n != s);
                Op::CloseS(s)
            }
            11 if !usable.is_empty() => Op::CloseP(usable[rng.gen_range(0..usable.len())].clone()),
            _ => Op::Flush,
        };
        return op;
    }
}

/// A statement to use: the unnamed one (if defined) with probability
/// `unnamed`, else mostly one the client holds, sometimes any name.
fn statement(rng: &mut StdRng, b: &Belief, unnamed: f64) -> String {
    if b.unnamed && rng.gen_bool(unnamed) {
        "_".to_owned()
    } else if !b.named.is_empty() && rng.gen_bool(0.75) {
        b.named[rng.gen_range(0..b.named.len())].clone()
    } else {
        pick(rng, &STATEMENTS[1..])
    }
}

/// Parameter values for a Bind of `stmt` as the client believes it.
fn params_for(case_texts: &[(String, usize)], stmt: &str) -> usize {
    case_texts.iter().rev().find(|(n, _)| n == stmt).map(|(_, k)| *k).unwrap_or(0)
}

fn name(s: &str) -> &str {
    if s == "_" {
        ""
    } else {
        s
    }
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// The wire bytes of one step. `defined` follows the client's Parses (for
/// the parameter count a Bind sends).
pub fn encode(step: &Step, defined: &mut Vec<(String, usize)>) -> Vec<u8> {
    let mut out = Vec::new();
    for op in &step.ops {
        let mut body = Vec::new();
        let tag = match op {
            Op::Parse { stmt, text } => {
                cstr(&mut body, name(stmt));
                cstr(&mut body, TEXTS[*text].0);
                body.extend_from_slice(&0i16.to_be_bytes());
                defined.push((stmt.clone(), TEXTS[*text].1));
                fe::PARSE
            }
            Op::Bind { portal, stmt, wrong } => {
                cstr(&mut body, name(portal));
                cstr(&mut body, name(stmt));
                body.extend_from_slice(&0i16.to_be_bytes());
                let n = params_for(defined, stmt) + usize::from(*wrong);
                body.extend_from_slice(&(n as i16).to_be_bytes());
                for i in 0..n {
                    let v = format!("{}", i + 3);
                    body.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    body.extend_from_slice(v.as_bytes());
                }
                body.extend_from_slice(&0i16.to_be_bytes());
                fe::BIND
            }
            Op::DescribeS(s) | Op::CloseS(s) => {
                body.push(b'S');
                cstr(&mut body, name(s));
                if matches!(op, Op::DescribeS(_)) {
                    fe::DESCRIBE
                } else {
                    fe::CLOSE
                }
            }
            Op::DescribeP(p) | Op::CloseP(p) => {
                body.push(b'P');
                cstr(&mut body, name(p));
                if matches!(op, Op::DescribeP(_)) {
                    fe::DESCRIBE
                } else {
                    fe::CLOSE
                }
            }
            Op::Execute { portal, rows } => {
                cstr(&mut body, name(portal));
                body.extend_from_slice(&rows.to_be_bytes());
                fe::EXECUTE
            }
            Op::Flush => fe::FLUSH,
            Op::Sync => fe::SYNC,
            Op::Query(q) => {
                cstr(&mut body, QUERIES[*q]);
                fe::QUERY
            }
        };
        out.extend_from_slice(&tagged(tag, &body));
    }
    out
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Parse { stmt, text } => write!(f, "P{stmt}={text}"),
            Op::Bind { portal, stmt, wrong } => write!(f, "B{portal}={stmt}{}", if *wrong { "!" } else { "" }),
            Op::DescribeS(s) => write!(f, "DS{s}"),
            Op::DescribeP(p) => write!(f, "DP{p}"),
            Op::Execute { portal, rows } => write!(f, "E{portal}/{rows}"),
            Op::CloseS(s) => write!(f, "CS{s}"),
            Op::CloseP(p) => write!(f, "CP{p}"),
            Op::Flush => write!(f, "F"),
            Op::Sync => write!(f, "S"),
            Op::Query(q) => write!(f, "Q{q}"),
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| format!("{}:{}", s.client, s.ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(";")))
            .collect();
        write!(f, "{}", steps.join(" | "))
    }
}

fn parse_op(s: &str) -> Op {
    let (a, b) = s[1..].split_once(['=', '/']).unwrap_or((&s[1..], ""));
    let (stmt, rest) = (a.to_owned(), b.to_owned());
    match s.as_bytes()[0] {
        b'P' => Op::Parse { stmt, text: rest.parse().unwrap_or_else(|_| bad(s)) },
        b'B' => Op::Bind { portal: stmt, wrong: rest.ends_with('!'), stmt: rest.trim_end_matches('!').to_owned() },
        b'D' if s.starts_with("DS") => Op::DescribeS(s[2..].to_owned()),
        b'D' if s.starts_with("DP") => Op::DescribeP(s[2..].to_owned()),
        b'C' if s.starts_with("CS") => Op::CloseS(s[2..].to_owned()),
        b'C' if s.starts_with("CP") => Op::CloseP(s[2..].to_owned()),
        b'E' => Op::Execute { portal: stmt, rows: rest.parse().unwrap_or_else(|_| bad(s)) },
        b'F' => Op::Flush,
        b'S' => Op::Sync,
        b'Q' => Op::Query(s[1..].parse().unwrap_or_else(|_| bad(s))),
        _ => bad(s),
    }
}

fn bad(op: &str) -> ! {
    panic!("bad op {op:?}")
}

/// A case from its text (see the module's doc).
pub fn parse_case(text: &str) -> Case {
    let steps: Vec<Step> = text
        .split(" | ")
        .map(|s| {
            let (c, ops) = s.trim().split_once(':').expect("client:ops");
            Step { client: c.parse().expect("client number"), ops: ops.split(';').map(parse_op).collect() }
        })
        .collect();
    let clients = steps.iter().map(|s| s.client + 1).max().unwrap_or(1);
    Case { clients, steps }
}

/// Whether a case keeps the rules that make its outcome the same through a
/// pool: the unnamed statement and portals are used only after the client
/// defined them since its last Sync, or in the transaction block still open
/// (else a pooled server may hold another client's); named statements only
/// where names resolve as they did when they were parsed, and the unnamed
/// portal only as `Rules` say. Shrinking keeps only such cases.
pub fn valid(case: &Case) -> bool {
    let mut defined: Vec<Vec<String>> = vec![Vec::new(); case.clients];
    let mut rules = vec![Rules::default(); case.clients];
    for step in &case.steps {
        let d = &mut defined[step.client];
        let r = &mut rules[step.client];
        for op in &step.ops {
            let ok = match op {
                Op::Parse { stmt, .. } => {
                    if stmt == "_" {
                        d.push("S_".into());
                    }
                    r.parse(stmt);
                    true
                }
                Op::Bind { portal, stmt, .. } => {
                    d.push(format!("P{portal}"));
                    r.bind(portal);
                    (stmt != "_" || d.contains(&"S_".to_owned())) && r.usable(stmt)
                }
                Op::DescribeS(st) => (st != "_" || d.contains(&"S_".to_owned())) && r.usable(st),
                Op::Query(q) => {
                    // It drops the unnamed statement; the block's end, its portals.
                    d.retain(|x| x != "S_");
                    if TX_ENDS.contains(q) {
                        d.clear();
                    }
                    r.query(*q);
                    true
                }
                Op::DescribeP(p) | Op::CloseP(p) | Op::Execute { portal: p, .. } => {
                    d.contains(&format!("P{p}")) && r.portal_usable(p)
                }
                // In a transaction block the server stays the same.
                Op::Sync => {
                    r.sync();
                    if !r.in_tx {
                        d.clear();
                    }
                    true
                }
                _ => true,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

/// Smaller variants of a case, for shrinking: each without one step, then
/// each with one op fewer.
pub fn smaller(case: &Case) -> Vec<Case> {
    let mut out = Vec::new();
    for i in 0..case.steps.len() {
        let mut c = case.clone();
        c.steps.remove(i);
        out.push(c);
    }
    for i in 0..case.steps.len() {
        for j in 0..case.steps[i].ops.len() {
            let mut c = case.clone();
            c.steps[i].ops.remove(j);
            c.steps.retain(|s| !s.ops.is_empty());
            out.push(c);
        }
    }
    out
}
