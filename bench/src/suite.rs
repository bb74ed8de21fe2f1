//! The `suite` benchmark (being built; see the issue it belongs to).

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("the suite benchmark is not built yet")
}
