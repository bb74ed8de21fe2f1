//! The `refill` benchmark (being built; see the issue it belongs to).

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("the refill benchmark is not built yet")
}
