//! The admin console of an in-process `Harness` over tokio-postgres (the
//! `process` module's helpers drive psql against the weir binary instead),
//! and a client connection that keeps the NOTICEs it is sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};

use crate::Harness;

/// The harness's console user (in its auth_file and admin_users).
pub const CONSOLE_USER: &str = "admin";
pub const CONSOLE_PASS: &str = "admin_pass";

/// A console connection to the harness's weir as the admin user.
pub async fn console(h: &Harness) -> Client {
    crate::connect(&format!("postgres://{CONSOLE_USER}:{CONSOLE_PASS}@{}/weir", h.addr())).await.expect("console login")
}

/// Runs a console command: its rows as column -> value (NULL as ""), or
/// the error weir sent.
pub async fn show(console: &Client, sql: &str) -> Result<Vec<HashMap<String, String>>, tokio_postgres::Error> {
    let mut rows = Vec::new();
    for m in console.simple_query(sql).await? {
        if let SimpleQueryMessage::Row(r) = m {
            let cols = r.columns().iter().enumerate();
            rows.push(cols.map(|(i, c)| (c.name().to_owned(), r.get(i).unwrap_or_default().to_owned())).collect());
        }
    }
    Ok(rows)
}

/// The row of `rows` whose `key` column is `value`.
pub fn row_where<'a>(rows: &'a [HashMap<String, String>], key: &str, value: &str) -> &'a HashMap<String, String> {
    rows.iter()
        .find(|r| r.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no row {key}={value}: {rows:?}"))
}

/// The primary messages of the NOTICEs a connection received, so far.
pub type Notices = Arc<Mutex<Vec<String>>>;

/// Connects with tokio-postgres, keeping each NOTICE's message.
pub async fn connect_keeping_notices(url: &str) -> Result<(Client, Notices), tokio_postgres::Error> {
    let (client, mut conn) = tokio_postgres::connect(url, NoTls).await?;
    let notices: Notices = Arc::default();
    let kept = notices.clone();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notice(n) = m {
                kept.lock().unwrap().push(n.message().to_owned());
            }
        }
    });
    Ok((client, notices))
}
