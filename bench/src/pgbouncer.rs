//! The PgBouncer the benchmarks compare weir with: the test kit's launcher
//! (`weir_testkit::pgbouncer`), which the e2e tests share.

pub use weir_testkit::pgbouncer::{installed, PgBouncer};
