//! Reading deploy/docker-compose.yml without a container engine: a service's `environment:`.

/// The `environment:` mapping (`KEY: "value"` lines) of `service` in compose `text`.
pub fn service_env(text: &str, service: &str) -> Vec<(String, String)> {
    let header = format!("  {service}:");
    let block: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim_end() != header)
        .skip(1)
        .take_while(|l| l.starts_with("   ") || l.trim().is_empty())
        .collect();
    block
        .iter()
        .skip_while(|l| l.trim() != "environment:")
        .skip(1)
        .take_while(|l| l.starts_with("      "))
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.to_string(), v.trim().trim_matches('"').to_string()))
        })
        .collect()
}
