//! `[log] log_format`: a `combined` line naming the limit and the bucket, and its config errors.

use super::*;

/// A `combined` line in a `log_format` names the decision, the refusing policy and the `pk`,
/// over HTTP/1.1, h2c and HTTP/2 over TLS; the variables of `combined` stay nginx's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combined_log_format_names_the_limit_and_the_bucket() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let format = "$remote_addr - $remote_user [$time_local] \\\"$request\\\" $status \
                  $body_bytes_sent \\\"$http_referer\\\" \\\"$http_user_agent\\\" \
                  $limit_req_status $limit_decision $limit_refused $limit_pk $cost";
    let toml = config(&up, "backend = \"memory\"", &access).replace(
        "format = \"json\"",
        &format!("format = \"combined\"\nlog_format = \"{format}\""),
    );
    let proxy = Proxy::start_with(&toml, tls_options(&ca, "h2c = true"));
    common::admin::wait_readyz(&proxy, 200, Duration::from_secs(20));
    let calls: Vec<_> = (PROTOCOLS.iter())
        .flat_map(|p| std::iter::repeat_n((0, *p, "noisy"), 2))
        .collect();
    let sent = send(&[&proxy], &ca, &calls).await;
    let denied = sent.iter().filter(|s| s.seen.status == 429).count();
    assert_eq!(denied, 1, "6 requests, 5 admitted");
    let pk = own_pk(&sent[0].seen);
    let lines = wait_lines(&access, 6);
    for line in &lines {
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(line.contains("\"GET /api/items HTTP/"), "{line}");
        let tail = match line.contains("\" 429 ") {
            true => format!(" REJECTED denied api-10s {pk} -"),
            false => format!(" PASSED allowed - {pk} -"),
        };
        assert!(line.ends_with(&tail), "{line} does not end with {tail:?}");
    }
    let versions = ["HTTP/1.1\"", "HTTP/2.0\""];
    assert!(
        versions.iter().all(|v| lines.iter().any(|l| l.contains(v))),
        "{lines:?}"
    );
}

#[test]
fn a_log_format_with_an_unknown_variable_names_its_file_line_and_key() {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [log]\nformat = \"combined\"\nlog_format = \"$remote_addr $limit\"\n";
    common::config::assert_invalid(text, "log.log_format", 6, "unknown variable $limit");
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [log]\nlog_format = \"$remote_addr\"\n";
    common::config::assert_invalid(text, "log.log_format", 5, "format = \"combined\"");
}
