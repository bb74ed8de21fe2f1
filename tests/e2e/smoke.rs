//! The newcomer's path in one test: connect through weir, query, and see
//! that weir holds no more server connections than its pool allows.

use weir_e2e::{Harness, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_through_weir() {
    let h = Harness::start(Opts::default()).await;
    let c = h.client().await;
    let row = c.query_one("select 40 + 2 as answer", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>("answer"), 42);
    let p = h.pool().snapshot();
    assert!(p.idle + p.active <= 5, "{p:?}");
}
