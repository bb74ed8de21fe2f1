//! `weir check-config PATH`: every problem of a config in one run. The text
//! is checked by `weir::config::check` (keys, types, PgBouncer-aware hints,
//! weir's rules); this module adds what needs the files the config names,
//! all offline: the auth_file, the auth_hba_file and the TLS files exist and
//! load, and unix_socket_dir is a folder weir can create its socket in (and
//! unix_socket_group a known group). A database with several hosts or a
//! target_session_attrs gets a line saying where its connections go. Warnings name what starts but fails
//! at login, as in PgBouncer (an auth_user or forced user with only a SCRAM
//! verifier there); they do not fail the check.

use std::path::Path;
use std::process::ExitCode;

use weir::auth::{hba::Hba, UserList};
use weir::config::{check, differences, Config};

pub fn run(path: &Path) -> ExitCode {
    let mut warnings = Vec::new();
    let problems = match std::fs::read_to_string(path) {
        Ok(text) => {
            let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let checked = check::check_text(&text, &base);
            let mut problems = checked.problems;
            if let Some(cfg) = &checked.config {
                problems.extend(file_problems(cfg, &mut warnings));
            }
            problems
        }
        Err(e) => vec![format!("cannot read it: {e}")],
    };
    for w in &warnings {
        eprintln!("{}: warning: {w}", path.display());
    }
    if problems.is_empty() {
        match Config::load(path) {
            Ok(cfg) => {
                println!("{}: ok ({} database(s))", path.display(), cfg.databases.len());
                for line in weir::config::hosts::explain(&cfg) {
                    println!("{}: {line}", path.display());
                }
                for note in differences::for_config(&cfg) {
                    println!("{}: differs from PgBouncer on purpose: {note}", path.display());
                }
            }
            Err(e) => println!("{}: ok, but loading it says: {e}", path.display()),
        }
        return ExitCode::SUCCESS;
    }
    for p in &problems {
        eprintln!("{}: {p}", path.display());
    }
    eprintln!("{}: {} problem(s)", path.display(), problems.len());
    ExitCode::FAILURE
}

/// What loading the files the config names would report; what would only
/// fail at login goes to `warnings`.
fn file_problems(cfg: &Config, warnings: &mut Vec<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let users = match cfg.auth_file_path() {
        Some(p) => match UserList::load(&p) {
            Ok(u) => Some(u),
            Err(e) => {
                problems.push(format!("weir.auth_file: cannot load {}: {e}", p.display()));
                None
            }
        },
        None => None,
    };
    if let Some(p) = cfg.auth_hba_file_path() {
        if let Err(e) = Hba::load(&p) {
            problems.push(format!("weir.auth_hba_file: cannot load {}: {e}", p.display()));
        }
    }
    if let Err(e) = weir::tls::load_client_tls(cfg) {
        problems.push(format!("client TLS: {e}"));
    }
    if let Err(e) = weir::tls::load_server_tls(cfg) {
        problems.push(format!("server TLS: {e}"));
    }
    problems.extend(socket_problems(cfg));
    // An auth_user or forced user missing from the auth_file logs in without
    // a password (PgBouncer's rule); one with only a SCRAM verifier cannot
    // where Postgres asks for one.
    if let Some(users) = &users {
        warnings.extend(weir::auth::stored_login_problems(cfg, users));
    }
    warnings.extend(any_without_forced_user(cfg));
    problems
}

/// With auth_type = "any", the databases without a forced user: their
/// logins fail with "bouncer config error", as in PgBouncer.
fn any_without_forced_user(cfg: &Config) -> Vec<String> {
    if cfg.weir.auth_type != weir::config::AuthType::Any {
        return Vec::new();
    }
    let unforced = cfg.databases.iter().filter(|(_, db)| db.user.is_none());
    unforced
        .map(|(name, _)| {
            format!(
                "databases.{name}: auth_type = \"any\" needs a forced user (user = ...): its logins fail with \
                 \"bouncer config error\" (as in PgBouncer)"
            )
        })
        .collect()
}

/// unix_socket_dir exists and is writable (a probe file is created and
/// removed); unix_socket_group is a group this machine knows.
fn socket_problems(cfg: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(socket) = cfg.unix_socket_path(cfg.weir.listen_addr.port()) else { return problems };
    let dir = socket.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        problems.push(format!("weir.unix_socket_dir: {} is not an existing folder", dir.display()));
    } else {
        let probe = dir.join(format!(".weir-check-{}", std::process::id()));
        match std::fs::File::create(&probe) {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
            }
            Err(e) => {
                problems.push(format!("weir.unix_socket_dir: weir cannot create its socket in {}: {e}", dir.display()))
            }
        }
    }
    let group = &cfg.weir.unix_socket_group;
    if !group.is_empty() {
        if let Err(e) = weir::app::group_id(group) {
            problems.push(format!("weir.unix_socket_group: {e}"));
        }
    }
    problems
}
