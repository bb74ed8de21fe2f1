//! Holds the idle-client memory work by test rather than by comment: the
//! client task's future (every connected client keeps one) and the future of
//! one request (boxed while it runs) must not grow past their budgets.
//! Sizes of futures as built, not timings.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use crate::auth::UserList;
use crate::cancel_keys::CancelKeys;
use crate::client::Session;
use crate::config::{Config, PoolMode};
use crate::login::{Budget, ClientStream, LoggedIn};
use crate::params::ParamMap;
use crate::pool::{PoolKey, Pools};
use crate::state::Shared;

/// The client task's future, as `cargo test` builds it (536 bytes: 528 at
/// the start of this test, then 8 for the session's pointer to its
/// statement state, boxed as it is used only once the pool makes the client
/// queue): under tokio's 640-byte task cell.
const CLIENT_FUTURE_BUDGET: usize = 536;
/// The per-request future (`Session::one_request`): 944 bytes with the reply
/// queue every transaction-mode client keeps, protocol 3.2's server cancel
/// keys and the forwarding loop's state in one struct (8 bytes of its
/// padding); boxed once per request, not kept while idle.
const REQUEST_FUTURE_BUDGET: usize = 944;

fn config() -> Config {
    Config::from_toml("[weir]\nauth_type = \"trust\"\n[databases.app]\n", std::path::Path::new(".")).unwrap()
}

async fn socket_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (server, client)
}

#[tokio::test]
async fn client_task_future_stays_within_budget() {
    let (socket, _peer_end) = socket_pair().await;
    let peer = socket.peer_addr().unwrap().into();
    let shared = Arc::new(Shared::new(config(), UserList::default()));
    let task = super::serve(ClientStream::Plain(socket), peer, shared);
    let size = std::mem::size_of_val(&task);
    assert!(size <= CLIENT_FUTURE_BUDGET, "client task future is {size} bytes, over its {CLIENT_FUTURE_BUDGET}");
}

#[tokio::test]
async fn request_future_stays_within_budget() {
    let (socket, _peer_end) = socket_pair().await;
    let mut client = ClientStream::Plain(socket);
    let cfg = config();
    let key = PoolKey { database: "app".into(), user: "u".into() };
    let pool = Pools::new().get_or_create(&cfg, &key, None).unwrap();
    let reg = CancelKeys::new().register();
    let login = LoggedIn {
        pool,
        mode: PoolMode::Transaction,
        params: ParamMap::new(),
        settings: ParamMap::new(),
        reg,
        budget: Budget::new(None, 1.0),
        max_message: cfg.weir.max_message_size,
        shutdown: crate::signal::Signal::new(),
    };
    let mut session = Session::new(&mut client, Default::default(), login);
    let request = session.one_request();
    let size = std::mem::size_of_val(&request);
    assert!(size <= REQUEST_FUTURE_BUDGET, "per-request future is {size} bytes, over its {REQUEST_FUTURE_BUDGET}");
}
